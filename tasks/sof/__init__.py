"""An embedded SQL-on-FHIR v2 ViewDefinition runner on fhirpathpy (no service to run), plus the MII lookup file
and how a CRTDL attribute group becomes a ViewDefinition. Plain Python: no Prefect in this package."""

from tasks.sof.view import CompiledView, ViewDefinitionError, ViewError, ViewEvaluationError, compile_view

__all__ = ["CompiledView", "ViewDefinitionError", "ViewError", "ViewEvaluationError", "compile_view"]
