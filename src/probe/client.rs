//! OpenAI-compatible and Anthropic probe calls (filled in by the probe client work).
