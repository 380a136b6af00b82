"""The runtime: what runs tasks. The dispatcher (queue, slots, in-flight map, settle),
what crosses the rings (calls, results, arrays), the worker's loop and the template that
forks workers.
"""
