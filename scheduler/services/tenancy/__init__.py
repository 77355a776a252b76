"""Tenants and what they pay and hear.

``tenants`` and ``trials`` manage accounts and free trials (``claims`` the link that hands a new tenant
its first key), ``keys`` and ``scope`` API keys and what each may touch, ``rates`` what a plan offers
(machine types and the price of an IPU-hour on each), ``metering`` charges held IPU-seconds against the
grant, ``usage`` reads them back, and ``notifications`` (events), ``thresholds`` (the events of a grant
or a trial running out), ``webhooks``, ``deliveries`` and ``mail`` tell a tenant's receivers and
inboxes what happened.
"""
