"""torchrun, as a cluster job needs it: every stop signal reaches the workers, and the launcher
ends as a single process does.

    python launch.py --standalone --nproc_per_node=8 train_classify.py --data /data/imagenet ...

It takes torchrun's own flags. Plain torchrun dies at once on SIGUSR1 (SLURM's --signal=USR1@120),
leaving its workers to train on, and after a SIGTERM it exits 1 with a traceback. Here SIGUSR1 is
passed on as SIGTERM is, each worker saves its stop checkpoint (training.StopSignals), and the exit
status is 128 + the signal, which a batch script can requeue on.
"""

import os
import sys

HELP_CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "launch-help")


def asks_for_help(argv):
    """Whether the command line asks for torchrun's own help: -h or --help before the training
    script (after it they are the script's)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True
        if not arg.startswith("-"):
            return False
    return False


def torchrun_help():
    """torchrun's --help text. torchrun builds it only after importing torch, which takes seconds,
    so the text is kept under .cache/ for each torch version, terminal width and program name."""
    import shutil
    from importlib import metadata

    prog = os.path.basename(sys.argv[0])
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:  # a torch without package metadata: no key to keep it by
        version = None
    width = shutil.get_terminal_size().columns  # argparse wraps the help to it
    path = os.path.join(HELP_CACHE, f"{prog}-torch-{version}-{width}.txt")
    if version is not None and os.path.exists(path):
        with open(path) as f:
            return f.read()

    from torch.distributed.run import get_args_parser

    text = get_args_parser().format_help()
    if version is not None:
        try:
            os.makedirs(HELP_CACHE, exist_ok=True)
            temp = f"{path}.{os.getpid()}.tmp"  # renamed into place: a reader never sees half of it
            with open(temp, "w") as f:
                f.write(text)
            os.replace(temp, path)
        except OSError:
            pass  # a read-only checkout: the help is built again next time
    return text


if __name__ == "__main__":
    if asks_for_help(sys.argv[1:]):
        sys.stdout.write(torchrun_help())
        sys.exit(0)

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main

    # torchrun's --signals-to-handle default, read from its PET_ variable, with SIGUSR1 added
    os.environ.setdefault("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    try:
        main()
    except SignalException as e:  # the workers have had the signal and have ended
        sys.exit(128 + e.sigval)
