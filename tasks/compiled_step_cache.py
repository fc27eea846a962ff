"""On-disk cache for functions compiled ahead with ``torch.compile(...).aot_compile``.

torch's own caches key a compiled graph on its code object, and an ahead-compiled one carries a
fresh name each process, so they never hit: without this cache every process would compile the
fused quad-hover step cold (~25-35 s at 4,096 envs on 2 cores) where a warm cache took ~4 s.
Loading a saved one takes less than a warm compile (docs/benchmarks/fused-step.md).

The key is a SHA-256 of everything that shapes the compiled code: torch and Python versions,
torch's thread count (baked into the CPU kernels), the host's instruction-set flags (inductor compiles for the CPU it runs on; a cache shared
between machines must not hand AVX-512 code to an AVX2 one), the source of every module in the
listed package folders, and the caller's parts (constants, tensor signature, options). Files live
beside torch's inductor cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the temp folder)
and are written atomically by torch; a file that does not load is logged and compiled again.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

FOLDER_NAME = "embodied_aot"
"""Sub-folder of torch's inductor cache folder that holds the saved functions."""


def default_cache_dir() -> Path | None:
    """``<inductor cache>/embodied_aot``, or None where torch's caches are turned off."""
    from torch._inductor import config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if inductor_config.force_disable_caches:
        return None
    return Path(cache_dir()) / FOLDER_NAME


def host_isa() -> str:
    """The CPU's model and instruction-set flags (Linux ``/proc/cpuinfo``), else the platform's
    processor string, with ATen's detected vector capability."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "model name", "Features")):
                    text += line
                if line.strip() == "":
                    break  # the first processor's block describes them all
    except OSError:
        text = platform.processor()
    return f"{platform.machine()}|{torch.backends.cpu.get_cpu_capability()}|{text}"


def source_digest(folders: Iterable[Path]) -> str:
    """SHA-256 over the names and bytes of every ``*.py`` file in ``folders`` (sorted)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(parts: Iterable[object], source_folders: Iterable[Path]) -> str:
    """Hex key of one compiled function: the caller's ``parts`` (their ``repr``) plus the
    versions, host ISA and sources this module adds."""
    digest = hashlib.sha256()
    # Inductor's CPU kernels specialize on the thread count (``#pragma omp parallel num_threads``).
    threads = torch.get_num_threads()
    for part in (torch.__version__, sys.version, host_isa(), threads, source_digest(source_folders), *parts):
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def load(path: Path, f_globals: dict[str, Any]) -> Callable[..., Any] | None:
    """The function saved at ``path`` with its guard check off, or None (absent or unloadable)."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as file:
            loaded: Any = torch.compiler.load_compiled_function(file, f_globals=f_globals)
        loaded.disable_guard_check()
    except Exception as err:  # a file from another torch, or cut short: compile it again
        log.warning("compiled-step cache: %s did not load (%s); compiling again", path, err)
        return None
    log.info("compiled-step cache: loaded %s", path)
    fn: Callable[..., Any] = loaded
    return fn


def save(fn: Any, path: Path) -> None:
    """Save an ``aot_compile`` result at ``path`` (atomically); a failure is logged, not raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fn.save_compiled_function(str(path))
    except Exception as err:  # a read-only or full disk costs the next process a compile, no more
        log.warning("compiled-step cache: could not save %s (%s)", path, err)
