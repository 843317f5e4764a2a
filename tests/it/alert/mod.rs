mod burn_tally;
mod claims;
mod counts;
mod delivery;
mod drift;
mod oncall;
mod oncall_kill;
mod routing;
