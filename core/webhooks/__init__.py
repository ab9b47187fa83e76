"""Events in (SPEC §17, issue 34): deliveries from GitHub, Standard Webhooks senders and alerting, verified,
rate-limited, deduplicated and stored before they are answered; no HTTP here (bot/event_routes.py)."""
