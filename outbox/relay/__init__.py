"""The relay: a run's parts in the order a message meets them (lease, batch, dispatch, delivery,
classify, record), composed by the processor; the stop rules, admission, the endpoint breakers
(a pure book and its writer), and the runtime that builds one processor per process. Imports the
core, the store (through its contract) and the transport; never the operations, the Azure
functions or the hosts."""
