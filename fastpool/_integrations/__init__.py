"""Integrations over a pool: asyncio, progress bars, and the Dask worker side.
The public facades (``fastpool.dask``) import from here.
"""
