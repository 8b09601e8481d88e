"""Detection evaluation: AP over BEV rotated IoU, both accumulation orders."""
from .ap import (ORDER_GLOBAL, ORDER_PER_FRAME, APAccumulator, APResult, format_ap_table,
                 plot_pr_curves, pr_envelope, voc_ap)

__all__ = ["APAccumulator", "APResult", "format_ap_table", "plot_pr_curves", "pr_envelope", "voc_ap",
           "ORDER_GLOBAL", "ORDER_PER_FRAME"]
