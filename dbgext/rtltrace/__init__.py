"""RTL_TRACE_DATABASE stack-trace databases (ntdll's and ntoskrnl's): layouts,
walker, validator, finder, renderers, the ``rtltrace`` command and a fixture
builder that follows Windows' own Create/Add algorithm."""
