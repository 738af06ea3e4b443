"""What a data directory remembers about itself beside TANK's files, in `<data>/.tiered/`:

- `disk_id`: a random name given to the volume when it is first used. Leadership claims record it
  (tiered.catalog.partitions.claim_leadership), so a broker reopening a disk can tell its own epochs from those of
  any other volume, even one that ran under the same broker id (a pod rescheduled onto a new volume).
- `epochs.json`: per partition, the last epoch whose start-up plan this disk carried out completely (truncation
  included). A claim after it that is not this disk's own means another leader's history may differ from this
  disk's records past the end of that epoch.
Both are written atomically (temporary file, fsync, rename, fsync of the directory). A lost directory is a lost
disk: a new disk_id, no epochs, and the partitions continue from the catalog.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from tiered.storage.segment import fsync_dir

DISK_ID = "disk_id"
EPOCHS = "epochs.json"


class LocalState:
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.disk_id = self._load_disk_id()
        self._epochs: dict[str, int] = self._load_epochs()

    def _load_disk_id(self) -> str:
        path = self.state_dir / DISK_ID
        try:
            text = path.read_text().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        disk_id = uuid.uuid4().hex
        self._write(DISK_ID, disk_id + "\n")
        return disk_id

    def _load_epochs(self) -> dict[str, int]:
        try:
            data = json.loads((self.state_dir / EPOCHS).read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ValueError(f"{self.state_dir / EPOCHS} is damaged ({exc}): remove it to treat every partition "
                             f"as led elsewhere since (its local records past the catalog are then dropped)") from exc
        return {str(k): int(v) for k, v in data.items()}

    def applied_epoch(self, topic: str, partition: int) -> int | None:
        return self._epochs.get(f"{topic}/{partition}")

    def record_applied(self, epochs: Mapping[tuple[str, int], int]) -> None:
        """Remembers, durably, that these partitions' plans were carried out under these epochs."""
        if not epochs:
            return
        for (topic, partition), epoch in epochs.items():
            self._epochs[f"{topic}/{partition}"] = epoch
        self._write(EPOCHS, json.dumps(self._epochs, sort_keys=True))

    def forget_topic(self, topic: str) -> None:
        prefix = f"{topic}/"
        kept = {k: v for k, v in self._epochs.items() if not k.startswith(prefix)}
        if len(kept) != len(self._epochs):
            self._epochs = kept
            self._write(EPOCHS, json.dumps(self._epochs, sort_keys=True))

    def _write(self, name: str, text: str) -> None:
        path = self.state_dir / name
        tmp = path.with_name(f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(str(self.state_dir))
