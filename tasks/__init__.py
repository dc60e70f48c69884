"""One module per pipeline step, named as the step; the layers below in folders.

The steps' part of the exception tree (the root's: ``tasks.core.errors``)::

    DupflowError
    └── StepError
        └── LocalImportError          local_import
"""
