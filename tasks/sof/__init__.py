"""An embedded SQL-on-FHIR v2 ViewDefinition runner on fhirpathpy (no service to run), plus the MII lookup file
and how a CRTDL attribute group becomes a ViewDefinition. A plain engine: no Prefect, and nothing of the pipeline
(it imports only ``tasks.errors`` for its errors' root and ``tasks.jsonfile`` to read a lookup file; cancellation
reaches it as a callable). Its errors are drawn in ``tasks.sof.errors``."""

from tasks.sof.errors import (
    CrtdlError,
    FhirPathError,
    LookupFileError,
    ResourceLineError,
    SofError,
    ViewDefinitionError,
    ViewError,
    ViewEvaluationError,
)
from tasks.sof.view import CompiledView, compile_view

__all__ = [
    "CompiledView",
    "CrtdlError",
    "FhirPathError",
    "LookupFileError",
    "ResourceLineError",
    "SofError",
    "ViewDefinitionError",
    "ViewError",
    "ViewEvaluationError",
    "compile_view",
]
