"""Helpers used by the first cells of every notebook.

``setup()`` makes a notebook's output the same on every machine (quiet known warnings, PNG
figures, tables with floats to 4 significant digits); ``show_source(obj)`` shows the package
code the notebook runs, so what the learner reads is what the tests ran;
``environment_report()`` says what this machine has.
"""

from __future__ import annotations

import inspect
import platform
import warnings


def setup() -> None:
    """Quiet known warnings, make figures PNG with a fixed size, and make tables render the same
    everywhere (pandas: floats to 4 significant digits, wide tables not wrapped); call once, first."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TRITON_INTERPRET.*")
    try:
        import matplotlib
        matplotlib.rcParams.update({"figure.figsize": (7.0, 3.6), "figure.dpi": 80,
                                    "savefig.dpi": 80, "svg.hashsalt": "llminfra"})
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        set_matplotlib_formats("png")
    except ImportError:
        pass
    try:
        import pandas as pd
        pd.set_option("display.float_format", "{:.4g}".format)
        pd.set_option("display.max_columns", 30)
        pd.set_option("display.width", 200)
    except ImportError:
        pass


def show_source(obj) -> None:
    """Print the source of a package function or class, with the file it lives in."""
    try:
        path = inspect.getsourcefile(obj) or "?"
        lines, start = inspect.getsourcelines(obj)
    except (TypeError, OSError) as e:
        raise ValueError(f"no source available for {obj!r}: {e}") from e
    rel = path.rsplit("llminfra/", 1)[-1]
    print(f"# llminfra/{rel}, line {start}")
    print("".join(lines), end="")


def environment_report() -> dict:
    """Python, torch, threads and the accelerator this kernel sees (no GPU is fine)."""
    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info
