// The passkey pages (channels/web/passkey_pages.py): enrol a passkey, or confirm an approval with one.
// The server makes and keeps the challenge; this script only carries its options to the browser's WebAuthn
// and the browser's answer back, with the page's form token (checked against a cookie: no other site can post).
"use strict";

(function () {
  const main = document.getElementById("passkey");
  if (!main) return;
  const kind = main.dataset.kind; // "enrol" or "step-up"
  const form = main.dataset.form;
  const button = document.getElementById("passkey-go");
  const status = document.getElementById("passkey-status");
  const base = window.location.pathname.replace(/\/+$/, "");

  const b64 = (buffer) => btoa(String.fromCharCode(...new Uint8Array(buffer)))
    .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  const bytes = (text) => {
    const padded = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
    return Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
  };

  async function post(path, body) {
    const response = await fetch(base + path, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify(Object.assign({form: form}, body)),
    });
    return {ok: response.ok, body: await response.json()};
  }

  function say(text, ok) {
    status.textContent = text;
    status.className = ok ? "done" : "error";
  }

  function creation(options) {
    options.challenge = bytes(options.challenge);
    options.user.id = bytes(options.user.id);
    (options.excludeCredentials || []).forEach((c) => { c.id = bytes(c.id); });
    return {publicKey: options};
  }

  function request(options) {
    options.challenge = bytes(options.challenge);
    (options.allowCredentials || []).forEach((c) => { c.id = bytes(c.id); });
    return {publicKey: options};
  }

  function answer(credential) {
    const r = credential.response;
    const out = {id: credential.id, rawId: b64(credential.rawId), type: credential.type,
                 clientExtensionResults: credential.getClientExtensionResults(), response: {
                   clientDataJSON: b64(r.clientDataJSON)}};
    if (r.attestationObject) {
      out.response.attestationObject = b64(r.attestationObject);
      if (r.getTransports) out.response.transports = r.getTransports();
    } else {
      out.response.authenticatorData = b64(r.authenticatorData);
      out.response.signature = b64(r.signature);
      if (r.userHandle) out.response.userHandle = b64(r.userHandle);
    }
    if (credential.authenticatorAttachment) out.authenticatorAttachment = credential.authenticatorAttachment;
    return out;
  }

  button.addEventListener("click", async () => {
    button.disabled = true;
    say("Waiting for your passkey…", true);
    try {
      const options = await post("/options", {});
      if (!options.ok) { say(options.body.message, false); return; }
      const credential = kind === "enrol"
        ? await navigator.credentials.create(creation(options.body.options))
        : await navigator.credentials.get(request(options.body.options));
      const finished = await post("/finish", {credential: answer(credential)});
      say(finished.body.message, finished.ok);
    } catch (error) {
      say("The passkey was not used (" + error.name + "). Reload the page to try again.", false);
      button.disabled = false;
    }
  });
})();
