"""Small programs that reproduce the classic mistakes of chapter 8, and a fault injector."""
