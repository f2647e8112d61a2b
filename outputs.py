"""What the scripts write: files that appear whole or not at all, and progress lines of long jobs.

A killed or failing writer never leaves half a file behind a name a later run reads (checkpoints,
shard indexes, prepared data, predictions), and a job of minutes says how far it is, one line at a
time, so that a terminal and a cluster log read the same.
"""

import argparse
import contextlib
import os
import secrets
import sys
import time

# Seconds between two progress lines of a long job; a job done sooner prints none.
PROGRESS_EVERY = 5.0


def progress(items, total, what, every=PROGRESS_EVERY, out=None):
    """``items``, passed through, with a line on ``out`` (stderr) every ``every`` seconds: ``what``,
    the count of ``total``, the rate and the ETA; one line at a time, so that it reads the same on a
    terminal and in a cluster log. A job done within the first ``every`` seconds prints nothing; one
    that printed ends with a line of its total time."""
    start = last = time.perf_counter()
    done = 0
    for done, item in enumerate(items, 1):
        yield item
        if (now := time.perf_counter()) - last >= every:
            last, rate = now, done / (now - start)
            eta = f", eta {round((total - done) / rate)} s" if total else ""
            print(
                f"{what}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f} %), "
                f"{rate:,.1f}/s{eta}",
                file=out or sys.stderr,
                flush=True,
            )
    if last > start:
        print(
            f"{what}: {done:,} done in {time.perf_counter() - start:.0f} s",
            file=out or sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    """A file that appears under ``path`` only once it is completely written (a temporary name in
    the same folder, then a rename), so that a killed writer never leaves half a file behind that
    name."""
    folder, name = os.path.split(path)
    # The process id and a random part: two nodes writing one shared folder at once (each its
    # copy of a shard index) may run processes of one id, each in its own container; the name is
    # what atomic_temp_pattern matches.
    tmp = os.path.join(folder, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_temp_pattern(name):
    """A regular expression of ``atomic_open``'s temporary names for the files that the expression
    ``name`` matches: what a killed writer leaves behind (an older version's names had no random
    part)."""
    return rf"\.{name}\.\d+(-[0-9a-f]+)?\.partial"


def file_to_write(text):
    """An argparse type for a file a script writes once its work is done (bench.py's and share.py's
    --json): a folder, or a file in a folder that does not exist, is refused before the work starts,
    not after it, with its results lost."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text} is a folder; expected a file name, such as {os.path.join(text, 'bench.json')}"
        )
    if not os.path.isdir(os.path.dirname(os.path.abspath(text))):
        raise argparse.ArgumentTypeError(f"{text}: its folder does not exist; make it first")
    return text
