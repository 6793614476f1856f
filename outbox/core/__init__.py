"""The core: the data (models, outcomes), the rules (backoff, signing, errors), the settings,
and how the process reports what it does (logs, telemetry). Imports nothing else of the
package."""
