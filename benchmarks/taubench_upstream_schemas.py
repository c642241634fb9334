"""Upstream tau2-bench's tool schemas, as its own code builds them, into a test fixture.

Provenance: github.com/sierra-research/tau2-bench at commit a2c0247 (the commit the tau-bench
plugin pins), ``Tool.openai_schema`` of every tool of ``get_tools()`` of the retail, airline and
telecom agent toolkits and of the telecom user toolkit. Run with a Python that has upstream's
dependencies (pydantic, docstring-parser, loguru, deepdiff, addict, toml, python-dotenv) and
upstream's ``src`` folder (e.g. ``git archive a2c0247 src | tar -x -C /tmp/tau2``)::

    python benchmarks/taubench_upstream_schemas.py /tmp/tau2/src \\
        > plugins/budgetbench-task-taubench/tests/data/upstream_tool_schemas.json

The fixture was made with pydantic 2.14.4 (the project's own). The plugin's test compares its
schemas with this file; upstream need not be installed for that.

``--texts`` writes instead the description texts alone (each tool's description and its
arguments' descriptions, from upstream's docstrings), which native mode sends
(``budgetbench_task_taubench/data/native_tool_texts.json``); the types and structure of the
schemas are built by the plugin from its own signatures and models.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

TOOLKITS = {
    "retail": ("tau2.domains.retail.tools", "RetailTools"),
    "airline": ("tau2.domains.airline.tools", "AirlineTools"),
    "telecom": ("tau2.domains.telecom.tools", "TelecomTools"),
    "telecom_user": ("tau2.domains.telecom.user_tools", "TelecomUserTools"),
}


def main() -> None:
    # the package without its __init__ (which imports the whole runner: pandas, litellm, ...);
    # every module below is upstream's own, imported as it is
    package = types.ModuleType("tau2")
    package.__path__ = [str(Path(sys.argv[1]) / "tau2")]
    sys.modules["tau2"] = package
    from loguru import logger

    logger.remove()  # upstream logs at import; the output is the JSON alone
    out = {}
    for key, (module, name) in TOOLKITS.items():
        toolkit = getattr(importlib.import_module(module), name)(None)  # schemas need no database
        out[key] = {tool.name: tool.openai_schema for tool in toolkit.get_tools().values()}
    out["_provenance"] = {
        "repository": "github.com/sierra-research/tau2-bench",
        "commit": "a2c0247",
        "built_by": "Tool.openai_schema of get_tools() per toolkit (benchmarks/taubench_upstream_schemas.py)",
        "pydantic": importlib.import_module("pydantic").VERSION,
    }
    if "--texts" in sys.argv:
        texts = {
            TOOLKITS[key][1]: {
                name: {
                    "description": schema["function"]["description"],
                    "arguments": {
                        argument: value["description"]
                        for argument, value in schema["function"]["parameters"]["properties"].items()
                        if "description" in value
                    },
                }
                for name, schema in out[key].items()
            }
            for key in TOOLKITS
        }
        out = {"_provenance": out["_provenance"], **texts}
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)  # upstream key order: it is what is sent
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
