"""Imported by every Python process of a real-engine benchmark run (the benchmark puts this folder on
PYTHONPATH). In the one that runs the Pulumi program (pulumi-language-python-exec, a child of the
language host, which the CLI's own figures cannot tell apart from it), it records the peak resident
memory and the CPU time at exit and, with GS_BENCH_PROFILE, a cProfile of the whole process. Nothing happens in any
other process, nor without GS_BENCH_HOOK_OUT; the program itself is not changed.
"""

import os


def _program_process() -> bool:
    # sys.argv is not set yet while site runs: the kernel's copy of the command line is.
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            return any(arg.endswith(b"pulumi-language-python-exec") for arg in cmdline.read().split(b"\0"))
    except OSError:
        return False


def _install(out: str) -> None:
    import atexit
    import json
    import resource

    stats = os.environ.get("GS_BENCH_PROFILE")
    profiler = None
    if stats:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()

    def report() -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(stats)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(out, "a") as file:
            file.write(json.dumps({"pid": os.getpid(), "peakKib": usage.ru_maxrss,
                                   "cpuSeconds": round(usage.ru_utime + usage.ru_stime, 3)}) + "\n")

    atexit.register(report)


if os.environ.get("GS_BENCH_HOOK_OUT") and _program_process():
    _install(os.environ["GS_BENCH_HOOK_OUT"])
