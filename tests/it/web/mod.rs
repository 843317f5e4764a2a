mod api;
mod api_props;
mod badges_feed;
mod bounds;
mod feed;
mod http_table;
mod pages;
mod pages_scale;
