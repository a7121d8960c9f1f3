"""What the figure tests (tests/figures/test_figures*.py) share: figures of the book's figure
module, drawn off screen and closed after each test."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from notebooks.figures import new_figure


@pytest.fixture
def figure():
    """figure(rows, columns, ...) -> (fig, axes), as notebooks.figures.new_figure gives them."""
    made = []

    def make(*args, **kwargs):
        made.append(new_figure(*args, **kwargs))
        return made[-1]

    yield make
    for fig, _ in made:
        plt.close(fig)


@pytest.fixture
def axes(figure):
    """One Axes of a new figure."""
    return figure()[1]
