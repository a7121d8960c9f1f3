"""Why `python ddp_scripts/train_single.py` finds the package ddp_scripts: Python puts the
script's own folder first on sys.path, so `import ddp_scripts` finds this module, and a module
with a __path__ is a package (the import system's rule): its submodules are this folder's
files. From the repository root (`python -m ddp_scripts.train_single`, notebooks, tests),
`import ddp_scripts` finds the folder itself, and this module is not used."""
import os

__path__ = [os.path.dirname(os.path.abspath(__file__))]
