"""Figures for deepseek_v4_flash_100steps, rebuilt from results/ only (no GPU, no network, no wandb).

    python experiments/deepseek_v4_flash_100steps/figures.py [--results DIR] [--quiet]

Draws every figure and the report (the same code as paper_figures/make_all.py), then lists
this experiment's figures and claim verdicts.
"""

import sys

from zeromismatch.audit.report import experiment_figures_main

if __name__ == "__main__":
    sys.exit(experiment_figures_main("deepseek_v4_flash_100steps"))
