"""torchrun, as a cluster job needs it: every stop signal reaches the workers, and the launcher
ends as a single process does.

    python launch.py --standalone --nproc_per_node=8 train_classify.py --data /data/imagenet ...

It takes torchrun's own flags. Plain torchrun dies at once on SIGUSR1 (SLURM's --signal=USR1@120),
leaving its workers to train on, and after a SIGTERM it exits 1 with a traceback. Here SIGUSR1 and
SIGUSR2 are passed on as SIGTERM and SIGHUP are, each worker saves its stop checkpoint
(training.StopSignals), and the exit status is 128 + the signal, which a batch script can requeue
on. A stop signal sent to one worker ends the job the same way, not restarted by --max-restarts:
the workers tell their launcher (training.StopSignals.tell_agent).
"""

import os
import sys

USAGE = f"""usage: launch.py [torchrun's flags] TRAINING_SCRIPT [its flags]
{__doc__}
torchrun's flags, listed by: python -m torch.distributed.run --help
"""


def asks_for_help(argv):
    """Whether the command line asks for launch.py's own help: -h or --help before the training
    script (after it they are the script's)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True
        if not arg.startswith("-"):
            return False
    return False


if __name__ == "__main__":
    if asks_for_help(sys.argv[1:]):  # torchrun's own help would first spend seconds importing torch
        sys.stdout.write(USAGE)
        sys.exit(0)

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main

    # torchrun's --signals-to-handle default, read from its PET_ variable, with the other stop
    # signals of the workers (training.STOP_SIGNALS) added
    os.environ.setdefault("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2")
    # Each rendezvous round's workers meet in a store of their own (on a new port), not in the
    # agent's, which outlives them: where nodes join and leave (--nnodes MIN:MAX) the agents count
    # their restarts differently, and no count names a round they all share.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    try:
        main()
    except SignalException as e:  # the workers have had the signal and have ended
        sys.exit(128 + e.sigval)
