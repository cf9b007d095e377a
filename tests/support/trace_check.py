"""Reads trace files ptrain's trace plugin wrote, with json.load and with Holistic
Trace Analysis (PyPI `HolisticTraceAnalysis`), for tests/trace.rs.

Usage: trace_check.py FILE [FILE ...]. Prints one JSON object {FILE: {...}} with:
  json:  the file's top-level keys, distributedInfo, the ProfilerStep#N spans (N),
         the set of CPU operator names, and the number of [memory] events
  hta:   the profiler steps HTA's TraceAnalysis finds, HTA's ranks, and the
         operator names in HTA's parsed frame
HTA loads one file at a time (its rank comes from the file's distributedInfo).
"""

import json
import logging
import os
import re
import sys

logging.disable(logging.WARNING)


def read_json(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    steps = sorted(
        int(m.group(1))
        for e in events
        if e.get("ph") == "X" and (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))
    )
    return {
        "keys": sorted(k for k in trace if k != "traceEvents"),
        "distributedInfo": trace.get("distributedInfo"),
        "profiler_steps": steps,
        "cpu_ops": sorted({e["name"] for e in events if e.get("cat") == "cpu_op"}),
        "memory_events": sum(1 for e in events if e.get("name") == "[memory]"),
        "shapes": any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op"),
    }


def read_hta(path):
    from hta.trace_analysis import TraceAnalysis

    rank = read_json(path)["distributedInfo"]["rank"]
    analysis = TraceAnalysis(
        trace_files={rank: os.path.basename(path)}, trace_dir=os.path.dirname(path), include_last_profiler_step=True
    )
    frame = analysis.t.get_trace(rank)
    symbols = analysis.t.symbol_table.sym_table
    return {
        "profiler_steps": sorted(int(s) for s in analysis.get_profiler_steps()),
        "ranks": sorted(int(r) for r in analysis.t.get_ranks()),
        "ops": sorted({symbols[i] for i in frame["name"].unique()}),
    }


def main():
    print(json.dumps({path: {"json": read_json(path), "hta": read_hta(path)} for path in sys.argv[1:]}))


if __name__ == "__main__":
    main()
