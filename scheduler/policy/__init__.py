"""Scheduling policy: pure functions over a snapshot, shared by the live loop and the simulator."""

from scheduler.policy.core import Decision, QueuedJob, RunningJob, Snapshot, TenantState, Wait, decide

__all__ = ["Decision", "QueuedJob", "RunningJob", "Snapshot", "TenantState", "Wait", "decide"]
