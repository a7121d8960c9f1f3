"""Small programs that reproduce the classic mistakes of chapter 8, the right way beside one
(spawn_worker.py), and a fault injector."""
