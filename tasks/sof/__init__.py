"""An embedded SQL-on-FHIR v2 ViewDefinition runner on fhirpathpy (no service to run), plus the MII lookup file
and how a CRTDL attribute group becomes a ViewDefinition.

A plain engine: no Prefect, and nothing of the pipeline. Of ours it imports only modules that know no pipeline
either: ``tasks.core.errors`` (the root of its errors, drawn in ``tasks.sof.errors``), ``tasks.core.jsonfile`` (reading
a lookup file), ``tasks.core.names`` (the rule for a group name that names a file) and ``tasks.streams.ndjson`` (the
one reader of the job's data files: plain or zstd, each line bounded). Cancellation reaches it as a callable.
"""
