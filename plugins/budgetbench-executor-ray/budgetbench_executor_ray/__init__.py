"""The Ray executor for BudgetBench (``--executor ray``)."""
