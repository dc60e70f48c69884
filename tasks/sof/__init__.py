"""An embedded SQL-on-FHIR v2 ViewDefinition runner, on fhirpathpy (no service).

Also the MII lookup file, and how a CRTDL attribute group becomes a ViewDefinition.

A plain engine: no Prefect, and nothing of the pipeline; of ours it imports only modules that know
no pipeline either (``tasks.core``, ``tasks.streams``). Cancellation reaches it as a callable.
"""
