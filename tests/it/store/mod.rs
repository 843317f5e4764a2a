mod catalog;
mod declared;
mod gateways;
mod migrate;
mod outcomes;
mod spend_figures;
mod spend_ledger;
mod tables;
