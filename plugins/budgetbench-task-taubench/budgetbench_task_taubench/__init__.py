"""tau-bench (tau2 retail, airline, mock) as a BudgetBench episodic task: our own implementation of
the upstream environments, tools and reward."""
