"""Will your model fit, and where is its peak? `python -m ddp_scripts.fit --help`.

trace.py reads the model (built with no memory), rules.py predicts each rank's bytes and
explains the peak, track.py checks it with torch's own tracker, check.py puts the two side
by side, tojs.py turns the rules into the page's calculator. Chapter 11's own calculator
comes first: memory_plan.py predicts each rank's bytes for the chapter's models, and
memory_run.py runs the steps that check it (track.py borrows its way of reading the peak).
"""
