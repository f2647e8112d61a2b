"""Per-thread summary of a py-spy raw profile (``py-spy record --threads --idle -f raw``): each thread's samples and
its most frequent innermost frames (native frames included with ``--native``).

    python3 results/h200-2026-11-29f/spy_summary.py profile.txt [frames per thread]
"""
import collections, re, sys

top = int(sys.argv[2]) if len(sys.argv) > 2 else 6
per_thread = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip("\n").rpartition(" ")
    frames = stack.split(";")
    thread = frames[0]
    # the innermost frame that is not libc / pthread plumbing says more than the futex it waits in
    leaf = next((f for f in reversed(frames[1:]) if not re.match(r"(0x[0-9a-f]+ \(libc|pthread_|__|syscall)", f)),
                frames[-1])
    per_thread[thread][re.sub(r" \(/.*?([^/]+:\d+)\)", r" (\1)", leaf)] += int(count)
total = sum(sum(c.values()) for c in per_thread.values())
for thread, counter in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
    n = sum(counter.values())
    print(f"{thread} {n} samples")
    for frame, k in counter.most_common(top):
        print(f"    {100 * k / n:5.1f} %  {frame[:150]}")
