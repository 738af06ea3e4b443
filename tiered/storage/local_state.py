"""What a data directory remembers about itself beside TANK's files, in `<data>/.tiered/`:

- `disk_id`: a random name given to the volume when it is first used. Leadership claims record it
  (tiered.catalog.partitions.claim_leadership), so a broker reopening a disk can tell its own epochs from those of
  any other volume, even one that ran under the same broker id (a pod rescheduled onto a new volume).
- per partition, the last epoch whose start-up plan this disk carried out completely (truncation included). A claim
  after it that is not this disk's own means another leader's history may differ from this disk's records past the
  end of that epoch. Kept as `epochs.json` (every partition's epoch, a snapshot) and `epochs.log` (what was recorded
  since, one line per change, appended): a claim of N partitions appends N short lines and syncs the file once,
  whatever the number of partitions the disk holds. Rewriting the whole snapshot per claim cost O(partitions held)
  each time: at 100,000 partitions, seconds of a failover's claims. The log is folded into the snapshot when it
  holds more lines than the snapshot has entries (and at start-up), so its length stays within the snapshot's.
`disk_id` and the snapshot are written atomically (temporary file, fsync, rename, fsync of the directory). A lost
directory is a lost disk: a new disk_id, no epochs, and the partitions continue from the catalog.

The log's lines are `set <topic> <partition> <epoch>` and `forget <topic>` (topic names hold no spaces). Replaying it
over a snapshot that already holds it changes nothing (each partition ends as the last line naming it says), so a
crash between writing a new snapshot and emptying the log loses nothing; a last line cut short by a crash is the
record that was not completed, and is ignored (the partition's plan is carried out again at the next claim).
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
EPOCHS_LOG = "epochs.log"
FOLD_AT_LEAST = 4096  # lines the log may hold before it is folded, however few partitions the snapshot has


class LocalState:
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.disk_id = self._load_disk_id()
        self._epochs: dict[str, int] = self._load_epochs()
        self._logged = 0  # lines in epochs.log
        if self._replay_log():
            self._fold()

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

    def _damaged(self, name: str, why: object) -> ValueError:
        return ValueError(f"{self.state_dir / name} is damaged ({why}): remove {EPOCHS} and {EPOCHS_LOG} to treat "
                          f"every partition as led elsewhere since (its local records past the catalog are then "
                          f"dropped)")

    def _load_epochs(self) -> dict[str, int]:
        try:
            data = json.loads((self.state_dir / EPOCHS).read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise self._damaged(EPOCHS, exc) from exc
        return {str(k): int(v) for k, v in data.items()}

    def _replay_log(self) -> bool:
        """Applies epochs.log over the snapshot; True if it held anything."""
        try:
            text = (self.state_dir / EPOCHS_LOG).read_text()
        except FileNotFoundError:
            return False
        lines = text.split("\n")
        # The last element is "" after a complete last line, or the line a crash cut short: never completed.
        for number, line in enumerate(lines[:-1], 1):
            words = line.split(" ")
            if words[0] == "set" and len(words) == 4 and words[2].isdigit() and words[3].isdigit():
                self._epochs[f"{words[1]}/{words[2]}"] = int(words[3])
            elif words[0] == "forget" and len(words) == 2:
                self._forget(words[1])
            else:
                raise self._damaged(EPOCHS_LOG, f"line {number}: {line[:80]!r}")
        return bool(text)

    def applied_epoch(self, topic: str, partition: int) -> int | None:
        return self._epochs.get(f"{topic}/{partition}")

    def record_applied(self, epochs: Mapping[tuple[str, int], int]) -> None:
        """Remembers, durably, that these partitions' plans were carried out under these epochs: one append and one
        sync, whatever their number."""
        if not epochs:
            return
        lines = []
        for (topic, partition), epoch in epochs.items():
            self._epochs[f"{topic}/{partition}"] = epoch
            lines.append(f"set {topic} {partition} {epoch}\n")
        self._append(lines)

    def forget_topic(self, topic: str) -> None:
        if self._forget(topic):
            self._append([f"forget {topic}\n"])

    def _forget(self, topic: str) -> bool:
        prefix = f"{topic}/"
        kept = {k: v for k, v in self._epochs.items() if not k.startswith(prefix)}
        forgot = len(kept) != len(self._epochs)
        self._epochs = kept
        return forgot

    def _append(self, lines: list[str]) -> None:
        if self._logged + len(lines) > max(FOLD_AT_LEAST, len(self._epochs)):
            self._fold()  # what the lines say is in self._epochs already: the new snapshot holds them
            return
        path = self.state_dir / EPOCHS_LOG
        created = not path.exists()
        with open(path, "a") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
        if created:
            fsync_dir(str(self.state_dir))
        self._logged += len(lines)

    def _fold(self) -> None:
        """A new snapshot with everything recorded, then an empty log."""
        self._write(EPOCHS, json.dumps(self._epochs, sort_keys=True))
        path = self.state_dir / EPOCHS_LOG
        if path.exists():
            with open(path, "w") as f:
                os.fsync(f.fileno())
        self._logged = 0

    def _write(self, name: str, text: str) -> None:
        path = self.state_dir / name
        tmp = path.with_name(f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(str(self.state_dir))
