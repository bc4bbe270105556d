"""Figures for qwen3_30b_a3b_tools, rebuilt from results/ only (no GPU, no network, no wandb).

    python experiments/qwen3_30b_a3b_tools/figures.py [--results DIR] [--quiet]

Draws every figure and the report (the same code as paper_figures/make_all.py), then lists
this experiment's figures and claim verdicts.
"""

import sys

from zeromismatch.audit.report import experiment_figures_main

if __name__ == "__main__":
    sys.exit(experiment_figures_main("qwen3_30b_a3b_tools"))
