"""The table of ``phases.py``'s records: each framework's timed parts in order, with the gaps between
them, up to the end of the first epoch's steps.

    python experiments/trainer_start/table.py OUT/start_jax.json OUT/start_tf.json
"""

from __future__ import annotations

import json
import sys


def rows(record: dict) -> list[tuple[str, float, float]]:
    """(part, start s, seconds) in order, a "(between)" row where a gap is >= 0.05 s, up to the first
    epoch's end."""
    out, last = [], 0.0
    for call in record["calls"]:
        if call["start"] - last >= 0.05:
            out.append(("(between: the trainer's other work)", last, call["start"] - last))
        out.append((call["part"], call["start"], call["end"] - call["start"]))
        last = max(last, call["end"])
        if call["part"].startswith("train_epoch"):
            break
    return out


def main() -> None:
    for path in sys.argv[1:]:
        record = json.load(open(path))
        print(f"\n{record['framework']} ({path}, rc {record['rc']})")
        print("| part | from s | seconds |\n|---|---:|---:|")
        for part, start, seconds in rows(record):
            print(f"| {part} | {start:.2f} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
