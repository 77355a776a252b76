"""Batch work, from submission to the end of its last attempt.

``jobs`` admits a job (spec, offers, quota reservation; ``submitter`` groups the API's submissions into
one transaction), ``arrays`` and ``dependencies`` admit sweeps, and ``scheduling`` runs the leader's pass
(placement, preemption, backfill) that turns queued jobs into ``attempts``, which host agents take and
drive to an end (``job_state`` holds what every part of a job's life shares: its events and its end).
``checkpoints`` and ``executables`` keep what a preempted or repeated job reuses, ``estimates`` answers
dry runs and waits, ``job_views`` assembles what the API and the dashboard show, and ``outbox`` holds
placed attempts until they are published to their host agents.
"""
