"""ETW stack cache ("stack caching"): walk, validate, look up StackKeys, simulate."""
