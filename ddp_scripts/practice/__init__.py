"""Small multi-process programs of chapter 9, "DDP in everyday practice": one per lesson.

Each runs alone under torchrun (`torchrun --nproc-per-node 2 ddp_scripts/practice/by_hand.py
--out runs/x`), and `everyday.py` runs several of them in one process group, to pay for one
start only. Each writes its results as JSON, which the chapter reads.
"""
