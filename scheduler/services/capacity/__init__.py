"""The fleet and its capacity.

``machines`` and ``fleet`` hold the racks and the allocator's view of them (``fleet_metrics`` what
Prometheus reads), ``partitions`` the V-IPU partitions carved from them (``vipu_user`` the V-IPU
endpoint's view, ``attempt_keys`` the credential a running attempt shows it), ``agents`` the host
agents that drive them, ``reconciler`` what repairs the truth when an agent or a machine is lost, and
``leader`` which scheduler process runs the passes.
"""
