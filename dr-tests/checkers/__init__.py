"""cutpoint.checkers: offline and live recovery checkers for guest workloads."""
