"""The Prefect layer's tasks: what a flow does, one step at a time, as task runs the UI shows.

Every task here is declared ``cache_policy=NO_CACHE``. Nothing of insitu is cached by Prefect (results are not
persisted, and a task's effects are on the exchange, the stores and MLflow), yet Prefect's default policy hashes
every input of every call to make a cache key: a ``SiteContext`` and a site's validation rows cost 0.3 to 0.5 s
of a loaded 2-core machine per call, on every round's critical path (validate, train, aggregate). Measured with
py-spy on the demo job; ``tests/unit/test_tasks_uncached.py`` keeps it so for new tasks.
"""
