"""What the jobs table holds of people (see ``service.db.registry``): a hand-over's payload
names its sender, quotes their words and their conversation. Erasure deletes a person's or a
group's jobs and redacts others' jobs that name the person; export lists them."""

from __future__ import annotations

from typing import Any

from service.db.registry import PERSON_FIELDS, PersonalTable, Redaction, names_filter
from service.queue import repository


async def _redact_jobs(r: Redaction) -> None:
    """Jobs of the person's conversations: others' hand-overs keep their payload, without the
    person's name and without the person's own messages quoted in them."""
    redactor = r.redactor
    uid = r.person_id

    def owned(item: dict[str, Any]) -> bool:
        return any(item.get(f) == uid for f in PERSON_FIELDS)

    for row in await repository.jobs_of_conversations(
        r.session, r.tenant_id, r.scope["groups"], r.scope["keys"]
    ):
        payload = redactor.json(row.payload, owned)
        result = redactor.json(row.result, owned)
        error = redactor.text(row.last_error) if row.last_error else row.last_error
        if (payload, result, error) != (row.payload, row.result, row.last_error):
            await repository.rewrite(r.session, r.tenant_id, row.id, payload, result, error)
            r.count("jobs_redacted")


# A finished job's result counts the profiles it wrote by their keys, which hold the ids of
# the people they describe: a person's own (user, private, member) keys leave every result.
# A member key's ids are escaped ('%' and ':'), so its last ':' ends the group's id.
_THEIR_KEY = """(k IN ('user:' || :u, 'private:' || :u)
    OR (k LIKE 'member:%' AND right(k, length(replace(replace(:u, '%', '%25'), ':', '%3A')) + 1)
        = ':' || replace(replace(:u, '%', '%25'), ':', '%3A')))"""
_PROFILE_KEYS_OF_PERSON = f"""
    UPDATE jobs SET result = jsonb_set(result, '{{profiles}}', COALESCE((
        SELECT jsonb_object_agg(k, v) FROM jsonb_each(result -> 'profiles') AS e(k, v)
        WHERE NOT {_THEIR_KEY}), '{{}}'::jsonb))
    WHERE tenant_id = :t AND jsonb_typeof(result -> 'profiles') = 'object'
      AND EXISTS (SELECT 1 FROM jsonb_object_keys(result -> 'profiles') AS e(k) WHERE {_THEIR_KEY})
"""

JOBS = PersonalTable(
    table="jobs",
    personal=("payload", "result", "last_error"),
    not_personal={
        "kind": "a code from a fixed set",
        "status": "a code from a fixed set",
        "lease_owner": "the worker process holding the job",
        "dedupe_key": "a key made of ids that runs a job once",
        "queueing_lock": "a key made of ids: one job of a conversation waits at a time",
    },
    # Their hand-overs, their private chat's jobs, an export or erasure of them.
    erase_user=(
        ("jobs", repository.DELETE_JOBS_OF_PERSON),
        ("job_results_scrubbed", _PROFILE_KEYS_OF_PERSON),
    ),
    erase_group=(("jobs", repository.DELETE_JOBS_OF_GROUP),),
    redact=_redact_jobs,
    export_user=f"""
           SELECT id, kind, status, attempts, payload, last_error, created_at,
                  (payload -> 'context' ->> 'sender_id' = :u
                   OR payload -> 'context' ->> 'user_id' = :u
                   OR payload ->> 'conversation_key' = :pk) AS own
           FROM jobs
           WHERE tenant_id = :t AND status IN ('queued', 'running', 'failed') AND id <> :spare
             AND (payload -> 'context' ->> 'sender_id' = :u
                  OR payload -> 'context' ->> 'user_id' = :u
                  OR payload ->> 'conversation_key' = :pk
                  OR ((payload -> 'context' ->> 'group_id' = ANY(:groups)
                       OR payload ->> 'conversation_key' = ANY(:keys))
                      AND {names_filter("payload::text")}))
           ORDER BY id""",
    # The names in the context of their hand-overs.
    own_names=(
        """SELECT payload -> 'context' ->> 'sender_name' AS name FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'sender_id' = :u
      AND payload -> 'context' ->> 'sender_name' IS NOT NULL""",
    ),
    # Another sender, or the bot, going by the name in a hand-over of one of their groups.
    namesakes=(
        """SELECT btrim(payload -> 'context' ->> 'sender_name') AS name,
           'g:' || (payload -> 'context' ->> 'group_id') AS key FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'group_id' = ANY(:groups)
      AND btrim(payload -> 'context' ->> 'sender_name') = ANY(:names)
      AND payload -> 'context' ->> 'sender_id' IS DISTINCT FROM :u""",
        """SELECT btrim(payload -> 'context' ->> 'bot_name') AS name,
           'g:' || (payload -> 'context' ->> 'group_id') AS key FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'group_id' = ANY(:groups)
      AND btrim(payload -> 'context' ->> 'bot_name') = ANY(:names)""",
    ),
)


# A request's receipt holds its dedupe key, the ids of the events its job writes and a digest
# of the request, no one's words. A hand-over's key and event ids name its conversation (its
# group, or the person of a private chat): they go with that conversation's erasure, else
# with the tenant and by their own retention.
def _their_turns(kind: str, param: str) -> str:
    """Delete the receipts of the turns of a conversation (``kind`` g or p, its id bound to
    ``param``): their keys start with ``end:<kind>:<id escaped>:``."""
    prefix = f"'end:{kind}:' || replace(replace({param}, '%', '%25'), ':', '%3A') || ':'"
    return f"DELETE FROM job_receipts WHERE tenant_id = :t AND starts_with(dedupe_key, {prefix})"


RECEIPTS = PersonalTable(
    table="job_receipts",
    not_personal={
        "dedupe_key": "a key made of a conversation's and the bot's ids that runs a job once",
        "answer": "the ids of the events a hand-over writes, made of its conversation's and the"
        " bot's ids",
        "fingerprint": "a digest of the request, which tells a repeat of it from another",
    },
    erase_user=(("receipts", _their_turns("p", ":u")),),
    erase_group=(("receipts", _their_turns("g", ":g")),),
)

TABLES = (JOBS, RECEIPTS)
