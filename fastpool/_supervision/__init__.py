"""Supervision: worker processes and their deaths, timeouts, memory, restart policy,
verdicts and sizing. Policy, verdict, memory and sizing are pure: tested without processes.
"""
