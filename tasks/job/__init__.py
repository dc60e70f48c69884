"""The job: record and folders, the step contract, per-file work, CRTDL enrichment.

Its part of the exception tree (the root's: ``tasks.core.errors``)::

    DupflowError
    ├── JobError
    │   └── RecordError           record: a job.json that cannot be read as a job record
    └── StepError
        ├── FlatteningError       flattening_outcome: the step cannot flatten its input
        └── EnrichmentError       crtdl_enrichment (also ValueError): the rules cannot apply
            └── UnresolvedLinkError
"""
