"""The flow, the command line and the local Prefect server.

Its part of the exception tree (the root's: ``tasks.core.errors``)::

    DupflowError
    ├── JobError
    │   └── JobLockedError        job_state: another process works on the job
    ├── ServerStartError          prefect_server: the local Prefect server did not come up
    └── ApiUnreachableError       prefect_api: no Prefect API answers, or it refuses the login
"""
