"""The official LoCoMo file, read from ../shared/data (never bundled: it is CC BY-NC 4.0)."""

import pytest

from budgetbench_core.testing import shared_data


@pytest.fixture(scope="session")
def locomo_file():
    return shared_data("locomo/locomo10.json")
