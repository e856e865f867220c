"""The summary of an import: what came in, what was there already, what was left out and why."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from service.importer.source import Skip

STAGES = ("profiles", "events", "memos", "jobs")


@dataclass
class Report:
    """What an import brought in, what was there already, and what was left out and why."""

    root: Path
    source_format: str
    tenant_id: uuid.UUID
    dry_run: bool
    imported: Counter[str] = field(default_factory=Counter)
    present: Counter[str] = field(default_factory=Counter)
    skipped: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The report as the command prints it."""
        verb = "would import" if self.dry_run else "imported"
        lines = [f"{verb} from {self.root} ({self.source_format}) into tenant {self.tenant_id}:"]
        extra = {
            "profiles": f" ({self.imported['revisions']} older revisions)",
            "jobs": f" ({self.imported['failed jobs']} had failed in the bot)",
        }
        for stage in STAGES:
            detail = extra.get(stage, "") if self.imported[stage] else ""
            lines.append(
                f"  {stage:<9} {self.imported[stage]:>6} new{detail},"
                f" {self.present[stage]} already there"
            )
        lines.append(f"skipped: {len(self.skipped)}")
        lines += [f"  {s.origin}: {s.reason}" for s in self.skipped]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {note}" for note in self.notes]
        if self.dry_run:
            lines.append("(dry run: nothing was written)")
        return "\n".join(lines)
