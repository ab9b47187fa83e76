"""``bot.toml`` read and checked as a whole: its top-level model, one-line errors that name the key's path, the
JSON Schema (`bot config schema`), and what the wiring loads from it. Read once per use; every table optional.

A channel owns its section (``[slack]``): the file's model is composed from the sections the installed channels
bring (``ChannelPlugin.section``), or from those passed in.
"""

from __future__ import annotations

import difflib
import functools
import os
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from dotenv import dotenv_values
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import ErrorDetails, core_schema

from bot.channels import installed_channels
from bot.config.agents import AgentTable
from bot.config.connections import ConnectionTable
from bot.config.event_sources import EventSourceTable
from bot.config.freezes import FreezeTable
from bot.config.mcp_servers import McpServerTable
from bot.config.policies import PolicyTable
from bot.config.spending import LimitsTable, PriceTable
from bot.config.table import Problem, Says, Table
from bot.errors import SettingsError
from bot.mcp.spec import McpServerSpec
from core.agents import DEFAULT_INSTRUCTIONS, Agent
from core.connections.spec import ConnectionSpec
from core.freezes import FreezeWindow
from core.policies import Policy
from core.spending import CapsConfig, PersonCaps
from core.webhooks.model import EventSource


def channel_sections() -> dict[str, type[BaseModel]]:
    """The installed channels' sections, by table name: each channel owns its model."""
    return {plugin.name: plugin.section for plugin in installed_channels() if plugin.section is not None}


def _unique(tables: list[Any], what: str) -> None:
    """Names are how a table is referred to (an agent, a connection, a tool prefix): two alike are refused."""
    first: dict[str, int] = {}
    for index, table in enumerate(tables):
        if table.name in first:
            raise Problem(f"{table.name!r} is already the name of {what}[{first[table.name]}]: names must be "
                          "unique", at=(index, "name"))
        first[table.name] = index


class BotToml(Table):
    """bot.toml (BOT_CONFIG): agents, approval rules, OAuth connections, MCP servers and each channel's section.
    Every table is optional."""

    agents: list[AgentTable] | None = Field(None, min_length=1, description="an array of tables, at least one: "
                                            "the agents; the first is the default agent (default: one agent "
                                            "from BOT_INSTRUCTIONS)")
    policies: list[PolicyTable] = Field([], description="an array of tables: approval rules, the "
                                                        "first that fits a call decides it")
    connections: list[ConnectionTable] = Field([], description="an array of tables: OAuth providers")
    mcp_servers: list[McpServerTable] = Field([], description="an array of tables: MCP tool servers")
    event_sources: list[EventSourceTable] = Field([], description="an array of tables: systems whose deliveries "
                                                                  "to POST /events/<name> wake an agent")
    freezes: list[FreezeTable] = Field([], description="an array of tables: change-freeze windows (cron in UTC "
                                                       "plus duration_s)")
    prices: list[PriceTable] = Field([], description="an array of tables: what each model's tokens cost (spending "
                                                     "caps, bot usage)")
    limits: LimitsTable | None = Field(None, description="a table: each person's daily spending caps")

    @field_validator("agents", "connections", "mcp_servers", "event_sources")
    @classmethod
    def _unique_names(cls, tables: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        _unique(tables or [], str(info.field_name))
        return tables

    @field_validator("prices")
    @classmethod
    def _one_price_per_model(cls, tables: list[PriceTable]) -> list[PriceTable]:
        first: dict[str, int] = {}
        for index, table in enumerate(tables):
            if table.model in first:
                raise Problem(f"{table.model!r} already has a price in prices[{first[table.model]}]: one per model",
                              at=(index, "model"))
            first[table.model] = index
        return tables

    @model_validator(mode="after")
    def _event_agents(self) -> BotToml:
        """An event source's agent is one the file defines (without [[agents]], only the default one)."""
        names = [table.name for table in self.agents] if self.agents is not None else [Agent().name]
        for index, table in enumerate(self.event_sources):
            if table.agent is not None and table.agent not in names:
                raise Problem(f"is {table.agent!r}, which is not an agent of [[agents]] (known: {', '.join(names)})",
                              at=("event_sources", index, "agent"))
        return self

    @model_validator(mode="after")
    def _agent_keys_are_their_own(self) -> BotToml:
        """An agent's key is sent to its base_url: a variable that holds another table's secret (an event source's,
        an OAuth app's) would go there too."""
        others = {table.secret_env: f"event_sources[{i}].secret_env" for i, table in enumerate(self.event_sources)}
        others |= {table.client_secret_env: f"connections[{i}].client_secret_env"
                   for i, table in enumerate(self.connections) if table.client_secret_env}
        for index, table in enumerate(self.agents or []):
            if table.api_key_env is not None and table.api_key_env in others:
                raise Problem(f"is {table.api_key_env}, which {others[table.api_key_env]} names: the agent's key is "
                              "sent to its base_url, so it must be a variable of its own",
                              at=("agents", index, "api_key_env"))
        return self

    def sections(self) -> list[str]:
        """The channel sections the file has."""
        return [name for name in type(self).model_fields if self.section(name) is not None]

    def section(self, name: str) -> BaseModel | None:
        """A channel's section (``[slack]``); None when the file has none."""
        value = getattr(self, name, None)
        return value if isinstance(value, BaseModel) else None


    # -- what the wiring takes from it (one read of the file serves them all) ---------------------------------

    def agent_list(self, default_instructions: str | None) -> list[Agent]:
        """``[[agents]]``; the first is the default. Without any (the file may hold only other tables), one
        default agent."""
        if self.agents is None:
            return [Agent(instructions=default_instructions or DEFAULT_INSTRUCTIONS)]
        return [table.agent(default_instructions) for table in self.agents]

    def caps_config(self) -> CapsConfig:
        """``[[prices]]``, each agent's caps and ``[limits]`` (core.spending)."""
        return CapsConfig(prices={table.model: table.price() for table in self.prices},
                          agents={table.name: table.caps() for table in self.agents or []},
                          person=self.limits.caps() if self.limits is not None else PersonCaps())

    def policy_list(self) -> list[Policy]:
        return [table.policy(number) for number, table in enumerate(self.policies, start=1)]

    def event_source_list(self) -> list[EventSource]:
        """``[[event_sources]]``, each source's agent given (default: the default agent). Their secrets are read
        from the environment by the wiring."""
        default = self.agents[0].name if self.agents else Agent().name
        return [table.source(default) for table in self.event_sources]

    def freeze_windows(self) -> tuple[FreezeWindow, ...]:
        return tuple(table.window() for table in self.freezes)

    def mcp_specs(self) -> list[McpServerSpec]:
        return [table.spec() for table in self.mcp_servers]

    def connection_specs(self, path: Path, *, env_file: Path | None = Path(".env")) -> dict[str, ConnectionSpec]:
        """``[[connections]]``, each with its client secret from the environment (or ``.env``); ``path`` names the
        file in errors."""
        if not self.connections:
            return {}
        dotenv: dict[str, str | None] = dict(dotenv_values(env_file)) if env_file and env_file.exists() else {}
        specs: dict[str, ConnectionSpec] = {}
        for index, table in enumerate(self.connections):
            secret = ""
            if (variable := table.client_secret_env) is not None:
                secret = os.environ.get(variable) or str(dotenv.get(variable) or "")
                if not secret:
                    raise SettingsError(f"{path}: connections[{index}].client_secret_env: the environment variable "
                                        f"{variable} (client_secret_env) is not set; set it to the OAuth app's "
                                        "client secret")
            specs[table.name] = table.spec(secret)
        return specs

@functools.cache
def _model(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[BotToml]:
    fields: dict[str, Any] = {name: (section | None, Field(None, description=f"a table ([{name}]): "
                                                           f"{(section.__doc__ or name).strip()}"))
                              for name, section in sections}
    return create_model("BotToml", __base__=BotToml, __doc__=BotToml.__doc__, **fields)


def config_model(sections: Mapping[str, type[BaseModel]] | None = None) -> type[BotToml]:
    """The model of the whole file, with these channel sections (default: the installed channels')."""
    return _model(tuple((channel_sections() if sections is None else sections).items()))


def load_config(path: Path, sections: Mapping[str, type[BaseModel]] | None = None) -> BotToml:
    """The checked file; every table empty when there is no file. A misspelt table or key (``[[agent]]``,
    ``quorom``) is refused: it must not quietly drop an agent's limits or a policy."""
    model = config_model(sections)
    if not path.exists():
        return model()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(f"{path}: {one_line(model, exc)}") from None


# -- one line per error, naming the key's path -----------------------------------------------------------------


def one_line(model: type[BaseModel], error: ValidationError) -> str:
    """The first problem, as ``policies[2].quorum must be …``: the path of the key and what it must be."""
    details = error.errors()
    tables = sorted(str(e["loc"][0]) for e in details if e["type"] == "extra_forbidden" and len(e["loc"]) == 1)
    if tables:  # said first: a misspelt table holds no key worth checking
        known = sorted(model.model_fields)
        guess = difflib.get_close_matches(tables[0], known, n=1)
        hint = f"; did you mean {_path(model, (guess[0],))}?" if guess else ""
        return f"unknown tables {tables} (known: {known}){hint}"
    return _said(model, details[0])


def _said(model: type[BaseModel], error: ErrorDetails) -> str:
    loc, kind = tuple(error["loc"]), error["type"]
    if kind == "extra_forbidden":
        known = _keys(model, loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {guess[0]!r}?" if guess else f"the known keys are {', '.join(known)}"
        return f"{_path(model, loc)} is not a known key; {hint} (unknown keys are refused)"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{_path(model, loc)} must be a table"
    if kind in ("value_error", "assertion_error"):
        problem = (error.get("ctx") or {}).get("error")
        if isinstance(problem, Problem):
            loc, text = (*loc, *problem.at), problem.text
        else:
            text = str(problem) if problem is not None else error["msg"]
        if text:
            return _joined(_path(model, loc), text)
    _kind, field_loc, info = _walk(model, loc)
    if info is None:
        return f"{_path(model, loc)}: {error['msg']}"
    says = next((m.text for m in _metadata(info) if isinstance(m, Says)), None)
    return _joined(_path(model, field_loc), says or f"must be {info.description or error['msg']}")


def _joined(path: str, text: str) -> str:
    """``quorum must be …``; a text that opens with ':' is about the table as a whole (``policies[0]: …``)."""
    return f"{path}{text}" if text.startswith(":") else f"{path} {text}"


def _path(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """``policies[2].quorum``, ``[slack].suggested_prompts[0].title``; a whole table: ``[[policies]]``, ``[slack]``."""
    head, rest = str(loc[0]), loc[1:]
    if not rest:
        info = model.model_fields.get(head)
        return f"[[{head}]]" if info is not None and get_origin(_bare(info.annotation)) is list else f"[{head}]"
    text = f"{head}[{rest[0]}]" if isinstance(rest[0], int) else f"[{head}]"
    for part in rest[0 if isinstance(rest[0], str) else 1:]:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _walk(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[Any, tuple[int | str, ...], FieldInfo | None]:
    """What ``loc`` reaches: the type there, and the deepest named key at or above it with its field (an item of
    a list is said of its list)."""
    kind: Any = model
    field_loc: tuple[int | str, ...] = loc
    info: FieldInfo | None = None
    for depth, part in enumerate(loc, start=1):
        kind = _bare(kind)
        if isinstance(part, int):
            kind = next(iter(get_args(kind)), None)
        elif isinstance(kind, type) and issubclass(kind, BaseModel) and part in kind.model_fields:
            field_loc, info = loc[:depth], kind.model_fields[part]
            kind = info.annotation
        else:
            return None, field_loc, info
    return _bare(kind), field_loc, info


def _keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` accepts."""
    kind = _walk(model, loc)[0]
    return sorted(kind.model_fields) if isinstance(kind, type) and issubclass(kind, BaseModel) else []


def _bare(kind: Any) -> Any:
    """``kind`` without ``Annotated`` and ``| None``: TOML has no null, so None only means "not given"."""
    while True:
        origin = get_origin(kind)
        if origin is Annotated:
            kind = get_args(kind)[0]
        elif origin in (Union, types.UnionType):
            kind = next(a for a in get_args(kind) if a is not type(None))
        else:
            return kind


def _metadata(info: FieldInfo) -> list[Any]:
    """The field's metadata, and that of an optional ``Annotated`` type (``Endpoint | None``)."""
    found = list(info.metadata)
    kind = info.annotation
    if get_origin(kind) in (Union, types.UnionType):
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Annotated:
        found += list(get_args(kind)[1:])
    return found


# -- the JSON Schema -------------------------------------------------------------------------------------------


class _TomlSchema(GenerateJsonSchema):
    """TOML has no null: an optional key is one left out, so its schema is the value's own."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default", ...) is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)


def config_schema(sections: Mapping[str, type[BaseModel]] | None = None) -> dict[str, Any]:
    """The JSON Schema of bot.toml, for editors (Even Better TOML, taplo) and `bot config schema`."""
    schema = config_model(sections).model_json_schema(schema_generator=_TomlSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "bot.toml"}


# -- what the wiring loads -------------------------------------------------------------------------------------


def load_agents(path: Path, *, default_instructions: str | None) -> list[Agent]:
    return load_config(path).agent_list(default_instructions)


def load_policies(path: Path) -> list[Policy]:
    return load_config(path).policy_list()


def load_connections(path: Path, *, env_file: Path | None = Path(".env")) -> dict[str, ConnectionSpec]:
    return load_config(path).connection_specs(path, env_file=env_file)


def load_mcp_servers(path: Path) -> list[McpServerSpec]:
    return load_config(path).mcp_specs()
