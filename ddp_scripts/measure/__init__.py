"""The measurement tools: the benchmark of chapters 7 and 10 (`benchmark.py`), the scripts'
overhead against a bare PyTorch loop (`overhead_benchmark.py`), how often a DDP run ends,
run after run, on each torch (`exit_benchmark.py`), the GPUs' links and driver that the
benchmark records (`links.py`), and the GPU micro-measurements `make gpu-check` runs
(`gpu_micro.py`). Each but links.py writes a results file under results/.
"""
