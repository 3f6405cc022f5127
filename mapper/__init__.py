"""Auto-mapper: cost model and placement search (HybridFlow, Section 6). See docs/auto-mapper.md."""

from hflow.mapper.plan import plan_placement

__all__ = ["plan_placement"]
