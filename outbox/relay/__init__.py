"""The relay: the lease loop and its stop rules, admission, the endpoint breakers, the processor
that delivers a batch, and the runtime that builds one per process. Imports the core, the store and
the transport; never the Azure functions or the hosts."""
