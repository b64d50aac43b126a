"""The exchange's JSON documents, one module per part of the protocol.

:mod:`~insitu.federated.documents.base` holds the base class and the bounded value types every document is
made of; the other modules hold the documents of one step each: the plan and statistics, the weights and
updates (manifests), the sites' metrics, the job summary and the control notices. Which document goes under
which kind and name, with which size bound, is :data:`insitu.federated.schemas.ARTEFACTS`.

This package's ``__init__`` imports none of them: a learning task (:mod:`insitu.specs`) builds its metrics
schema on :mod:`~insitu.federated.documents.base` while :mod:`~insitu.federated.documents.evaluation`
assembles the tasks' schemas, so importing one must not import the other.
"""
