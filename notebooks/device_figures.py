"""Chapters 1 and 3: which GPUs a process sees, and where tensors live, drawn from runs.

    from notebooks.device_figures import (physical_gpus, visible_devices_runs,
                                          draw_visible_devices, placements, draw_placements)

`visible_devices_runs` starts one child Python per value of CUDA_VISIBLE_DEVICES; each child
reports, as one JSON line, how torch parses the variable and which GPUs it then sees (name and
UUID). `draw_visible_devices` puts each child's cuda:N beside the physical GPU with the same
UUID. `placements` makes a tensor and a model, moves both with .to(device), and records where
each tensor lives and how many bytes it holds; `draw_placements` draws that.

The chapters' verdicts on what a child saw are decided here too, from the UUIDs it reported:
`renumbered_line` (the variable set before CUDA starts) and `late_setting_line` (set after);
and `code_for_cards`, whether this build has GPU code for a card, by torch's own rule.
"""
import json
import os
import subprocess
import sys

import torch

from notebooks.figures import colour

# What each child reports: the variable, torch's parse of it, and the GPUs it then sees.
REPORT = """
import json, os, torch
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
devices = []
for i in range(count):
    props = torch.cuda.get_device_properties(i)
    uuid = str(getattr(props, "uuid", "?"))
    devices.append({"index": i, "name": props.name,
                    "uuid": uuid if uuid.startswith("GPU-") else "GPU-" + uuid})
print(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "parsed": torch.cuda._parse_visible_devices(), "count": count,
                  "devices": devices}))
"""


def physical_gpus():
    """The GPUs of this process (its own numbering), as the children report theirs."""
    gpus = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "?"))
        gpus.append({"index": i, "name": props.name,
                     "uuid": uuid if uuid.startswith("GPU-") else "GPU-" + uuid})
    return gpus


def visible_devices_runs(values, timeout=300):
    """One child per value of CUDA_VISIBLE_DEVICES (None: unset), all started at once.

    Returns the children's reports, in the order of `values`.
    """
    children = []
    for value in values:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if value is not None:
            env["CUDA_VISIBLE_DEVICES"] = value
        children.append(subprocess.Popen([sys.executable, "-c", REPORT], env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    reports = []
    for child in children:
        out, err = child.communicate(timeout=timeout)
        if child.returncode != 0:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            raise RuntimeError(f"a child failed (exit status {child.returncode}): {last}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def setting_label(value):
    """How a value of the variable is written in the figure."""
    return "unset" if value is None else f"={value!r}" if value == "" else f"={value}"


def parsed_label(report):
    """torch's parse of the variable, short: unset means every GPU (torch lists 0 to 63)."""
    if report["visible"] is None:
        return "every GPU"
    return "reads [" + ",".join(str(p) for p in report["parsed"]) + "]"


NO_GPU = "No GPU on this machine"  # how a figure says that its GPU part is not drawn here


def _box(ax, x, y, text, kind, index=0):
    ax.text(x, y, text, ha="center", va="center",
            bbox=dict(boxstyle="round,pad=0.35", fc=colour(kind, index), alpha=0.3,
                      ec="#333333"))


def draw_visible_devices(ax, physical, reports):
    """The machine's GPUs in the first column; one column per child, its cuda:N in the row of
    the physical GPU with the same UUID. Returns what was drawn, for a test to compare."""
    rows = max(len(physical), 1)
    uuid_row = {gpu["uuid"]: row for row, gpu in enumerate(physical)}
    drawn = {"physical": [], "columns": []}
    ax.text(0, -1.2, "machine", ha="center", va="center", weight="bold")
    for row, gpu in enumerate(physical):
        label = f"GPU {gpu['index']}\n{gpu['name'].replace('NVIDIA ', '')[:10]}"
        _box(ax, 0, row, label, "other")
        drawn["physical"].append(label)
    if not physical:
        ax.text(0, 0, "no GPU", ha="center", va="center", color="#555555")
    for column, report in enumerate(reports, start=1):
        header = f"{setting_label(report['visible'])}\n{parsed_label(report)}"
        ax.text(column, -1.2, header, ha="center", va="center")
        logical = {}
        for device in report["devices"]:
            row = uuid_row.get(device["uuid"])
            logical[f"cuda:{device['index']}"] = row
            _box(ax, column, rows if row is None else row, f"cuda:{device['index']}",
                 "compute")
        if not report["devices"]:
            ax.text(column, 0, "0 GPUs", ha="center", va="center", color="#555555")
        drawn["columns"].append({"setting": header, "count": report["count"],
                                 "logical": logical})
    unmatched = any(None in column["logical"].values() for column in drawn["columns"])
    ax.set_xlim(-0.6, len(reports) + 0.6)
    ax.set_ylim(rows - 0.4 + unmatched, -1.8)
    ax.axis("off")
    title = "CUDA_VISIBLE_DEVICES, torch's parse of it, and the GPUs each child sees"
    if not physical:
        title += f"\n{NO_GPU}: only the parse shows; the cuda:N boxes need GPUs"
    ax.set_title(title, fontsize=10)
    return drawn


def _record(name, tensor):
    return {"name": name, "device": str(tensor.device),
            "bytes": tensor.nelement() * tensor.element_size(), "address": tensor.data_ptr()}


def placements(device):
    """A tensor and a small model, before and after .to(device): where each tensor lives.

    x.to(device) returns a tensor (x itself stays where it was); model.to(device) moves the
    model's own parameters. Returns {"device", "before": [...], "after": [...], "same_x",
    "same_weight"}: each record has the name, device, bytes and data address.
    """
    x = torch.randn(256, 64)
    model = torch.nn.Linear(64, 10)
    before = [_record("x", x), _record("model.weight", model.weight),
              _record("model.bias", model.bias)]
    weight = model.weight
    x_moved = x.to(device)
    model.to(device)
    after = [_record("x", x), _record("x.to(device)", x_moved),
             _record("model.weight", model.weight), _record("model.bias", model.bias)]
    return {"device": str(device), "before": before, "after": after,
            "same_x": x_moved is x, "same_weight": model.weight is weight}


def size_label(count):
    """Bytes, short: 64 KiB, 2.5 KiB, 40 B."""
    if count >= 2**10:
        return f"{count / 2**10:.3g} KiB"
    return f"{count} B"


def draw_placements(ax, run):
    """One lane per device that holds a tensor; a row before and a row after .to(device).
    Returns {stage: {device: [labels]}} as drawn."""
    devices = []
    for record in run["before"] + run["after"]:
        if record["device"] not in devices:
            devices.append(record["device"])
    drawn = {}
    for y, stage in enumerate(("before", "after")):
        drawn[stage] = {}
        for lane, device in enumerate(devices):
            here = [r for r in run[stage] if r["device"] == device]
            drawn[stage][device] = []
            for k, record in enumerate(here):
                label = f"{record['name']}  {size_label(record['bytes'])}"
                offset = (k - (len(here) - 1) / 2) * 0.22
                _box(ax, lane, y + offset, label, "data" if device == "cpu" else "compute")
                drawn[stage][device].append(label)
    ax.set_xticks(range(len(devices)), devices)
    ax.xaxis.tick_top()
    ax.set_yticks([0, 1], ["created", f".to({run['device']})"])
    ax.set_xlim(-0.6, len(devices) - 0.4)
    ax.set_ylim(1.55, -0.55)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xlabel(f"x.to(device) is x: {run['same_x']};  "
                  f"model.weight is the same Parameter: {run['same_weight']}")
    if devices == ["cpu"]:
        ax.set_title(".to(cpu) moves nothing: one lane; a GPU device adds a lane of its own",
                     fontsize=10, pad=24)
    return drawn


def draw_local_ranks(ax, workers):
    """Each torchrun worker of one node: its LOCAL_RANK, the device pick_device gave it, and
    which entry of CUDA_VISIBLE_DEVICES that device is (ddp_scripts/recorders/who_am_i.py's records).
    Returns [(local rank label, device label, physical label)] as drawn."""
    drawn = []
    workers = sorted(workers, key=lambda w: int(w["LOCAL_RANK"]))
    for row, worker in enumerate(workers):
        device = worker["device"]
        if device.startswith("cuda"):
            index = int(device.split(":")[1])
            physical = f"physical GPU {worker['visible_parsed'][index]}"
        elif device.startswith("none"):
            device, physical = "no device", "error (too few GPUs)"
        else:
            physical = "the CPU"
        labels = (f"LOCAL_RANK {worker['LOCAL_RANK']}", f"pick_device: {device}", physical)
        for column, (label, kind) in enumerate(zip(labels, ("other", "compute", "data"))):
            _box(ax, column, row, label, kind)
            if column:
                ax.annotate("", (column - 0.42, row), (column - 0.58, row),
                            arrowprops=dict(arrowstyle="->", color="#333333"))
        drawn.append(labels)
    first = workers[0]
    setting = setting_label(first["CUDA_VISIBLE_DEVICES"])
    ax.set_title(f"torchrun --nproc-per-node {len(workers)} with CUDA_VISIBLE_DEVICES"
                 f"{setting if setting != 'unset' else ' unset'}: torch reads "
                 f"{first['visible_parsed'] if first['CUDA_VISIBLE_DEVICES'] is not None else 'every GPU'}",
                 fontsize=10)
    if all(worker["device"] == "cpu" for worker in workers):
        ax.set_title(f"{ax.get_title()}\n{NO_GPU}: no worker has a GPU to take",
                     fontsize=10)
    ax.set_xlim(-0.6, 2.6)
    ax.set_ylim(len(workers) - 0.4, -0.6)
    ax.axis("off")
    return drawn


def kernel_numbers(kernel_uuids, uuids):
    """This kernel's numbers (cuda:N) for the GPUs a child saw, given by UUID."""
    return [f"cuda:{kernel_uuids.index(u)}" if u in kernel_uuids else "a GPU this kernel lacks"
            for u in uuids]


def renumbered_line(kernel_uuids, seen, physical):
    """Whether a child told CUDA_VISIBLE_DEVICES=<physical> saw that GPU alone, as its cuda:0:
    one line. kernel_uuids: this kernel's GPUs, in its numbering (every GPU when its own variable
    is unset); seen: the UUIDs the child saw, in its numbering."""
    numbers = kernel_numbers(kernel_uuids, seen)
    if physical < len(kernel_uuids) and seen == [kernel_uuids[physical]]:
        return (f"The child's cuda:0 is this kernel's {numbers[0]}: physical GPU {physical}, "
                "renumbered.")
    return (f"The child saw {', '.join(numbers) or 'no GPU'}: NOT this kernel's "
            f"cuda:{physical} alone as its cuda:0.")


def late_setting_line(kernel_uuids, seen, value):
    """Whether a child that set CUDA_VISIBLE_DEVICES=<value> after CUDA had started still has
    every GPU of this kernel, in the same order (the setting came too late): one line."""
    numbers = kernel_numbers(kernel_uuids, seen)
    if seen == list(kernel_uuids):
        return (f"The variable now says {value}, yet the child still has all {len(seen)} GPU(s), "
                f"and its cuda:0 is this kernel's {numbers[0]}: the setting came too late.")
    return (f"The variable says {value}, and the child has {', '.join(numbers) or 'no GPU'}, "
            f"NOT all {len(kernel_uuids)} of this kernel's in its order: the setting took "
            "effect.")


def code_for_cards(cards, arch_list):
    """{card: whether this build has code that runs on it}, by torch's own rule
    (torch.cuda._code_compatible_with_device, which torch's start-up warning uses).
    cards: {name: (major, minor)}; arch_list: torch.cuda.get_arch_list()."""
    import torch
    code = [torch.cuda._extract_arch_version(arch) for arch in arch_list]
    return {card: any(torch.cuda._code_compatible_with_device(10 * major + minor, c)
                      for c in code)
            for card, (major, minor) in cards.items()}
