//! # tl-nn-derive: `#[derive(Parameters)]` for tl-nn models
//!
//! Use it through tl-nn, beside the trait of the same name (as serde's derives are used):
//!
//! ```ignore
//! #[derive(tl_nn::Parameters)]
//! struct Lm<O: Train> {
//!     tok: Embedding,
//!     blocks: Vec<Block>,       // every element, in order
//!     head: Option<Linear>,     // when present
//!     body: Sequential<O>,      // a model generic over the session
//!     #[parameters(skip)]
//!     width: usize,             // holds no layer
//! }
//! ```
//!
//! The derive writes `tl_nn::Parameters` for the type:
//! - `visit_params` visits every field that is not skipped, in declaration order (the order of
//!   `named_params_of` and of checkpoints), through the field type's own `Parameters` impl:
//!   layers, models, `Vec`, `Option`, `Box`, arrays and bare `Param`s all have one;
//! - `visit_children` hands each such field to the printer with its name (`tok`, `blocks`; a
//!   tuple struct's fields are `0`, `1`, …), so `tl_nn::tree(&model)` and
//!   `Runtime::summary` show the model as PyTorch prints a module.
//!
//! Structs (named, tuple, unit) and enums (the fields of the variant in use) are supported;
//! unions are an error. Generic types get a `FieldType: Parameters` bound for each field whose
//! type mentions a type parameter, so `struct M<O: Train> { seq: Sequential<O> }` needs no
//! bound written by hand. A field whose type has no `Parameters` impl (`usize`, `f64`, a
//! `PhantomData`) is a compile error pointing at it until it is marked `#[parameters(skip)]`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Generics, Ident, Type, parse_macro_input};

/// Implement `tl_nn::Parameters` from the type's fields: `visit_params` visits every field
/// not marked `#[parameters(skip)]`, in order; `visit_children` names them for printing.
#[proc_macro_derive(Parameters, attributes(parameters))]
pub fn derive_parameters(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// One field the derive visits: how to reach it, its name in the printed tree, its type.
struct Field {
    access: TokenStream,
    name: String,
    ty: Type,
}

/// The impl for `input`, or the error to report at the offending tokens.
fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let ident = &input.ident;
    let (visit, children, types) = match &input.data {
        Data::Struct(s) => {
            let fields = fields(&s.fields, |i, f| match &f.ident {
                Some(name) => quote!(&self.#name),
                None => {
                    let index = syn::Index::from(i);
                    quote!(&self.#index)
                }
            })?;
            let visit = fields.iter().map(visit_one);
            let children = fields.iter().map(child_one);
            let types: Vec<Type> = fields.iter().map(|f| f.ty.clone()).collect();
            (quote!(#(#visit)*), quote!(#(#children)*), types)
        }
        Data::Enum(e) => {
            let (mut visit_arms, mut child_arms, mut types) = (Vec::new(), Vec::new(), Vec::new());
            for v in &e.variants {
                let vname = &v.ident;
                let fields = fields(&v.fields, |i, f| match &f.ident {
                    Some(name) => quote!(#name),
                    None => binding(i),
                })?;
                // Bind every field (skipped ones with `_`) so the pattern is exhaustive.
                let bind = |f: &syn::Field, i: usize| -> TokenStream {
                    let skipped = is_skipped(f).unwrap_or(false);
                    match (&f.ident, skipped) {
                        (Some(name), false) => quote!(#name),
                        (Some(name), true) => quote!(#name: _),
                        (None, false) => binding(i),
                        (None, true) => quote!(_),
                    }
                };
                let binds = v.fields.iter().enumerate().map(|(i, f)| bind(f, i));
                let pattern = match &v.fields {
                    Fields::Named(_) => quote!(Self::#vname { #(#binds),* }),
                    Fields::Unnamed(_) => quote!(Self::#vname ( #(#binds),* )),
                    Fields::Unit => quote!(Self::#vname),
                };
                let visit = fields.iter().map(visit_one);
                let children = fields.iter().map(child_one);
                visit_arms.push(quote!(#pattern => { #(#visit)* }));
                child_arms.push(quote!(#pattern => { #(#children)* }));
                types.extend(fields.iter().map(|f| f.ty.clone()));
            }
            (
                quote!(match self { #(#visit_arms)* }),
                quote!(match self { #(#child_arms)* }),
                types,
            )
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "#[derive(Parameters)] supports structs and enums, not unions",
            ));
        }
    };
    let generics = with_bounds(&input.generics, &types);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::tl_nn::Parameters for #ident #ty_generics #where_clause {
            fn visit_params(
                &self,
                __f: &mut dyn ::core::ops::FnMut(&::tl_nn::__private::Param),
            ) {
                #visit
            }

            fn visit_children(
                &self,
                __f: &mut dyn ::core::ops::FnMut(&str, &dyn ::tl_nn::Parameters),
            ) {
                #children
            }
        }
    })
}

/// The binding of an enum variant's unnamed field `i` in the derive's patterns.
fn binding(i: usize) -> TokenStream {
    let id = format_ident!("__field{}", i);
    quote!(#id)
}

/// The fields that are not skipped, each reached by `access(index, field)`.
fn fields(
    fields: &Fields,
    access: impl Fn(usize, &syn::Field) -> TokenStream,
) -> syn::Result<Vec<Field>> {
    let mut out = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        if is_skipped(f)? {
            continue;
        }
        out.push(Field {
            access: access(i, f),
            name: f
                .ident
                .as_ref()
                .map_or_else(|| i.to_string(), Ident::to_string),
            ty: f.ty.clone(),
        });
    }
    Ok(out)
}

/// Whether the field carries `#[parameters(skip)]`; any other `parameters` argument is an
/// error naming it.
fn is_skipped(f: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in f.attrs.iter().filter(|a| a.path().is_ident("parameters")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                let name = meta
                    .path
                    .get_ident()
                    .map_or_else(|| "this argument".to_owned(), |i| format!("`{i}`"));
                Err(meta.error(format!(
                    "unknown #[parameters(...)] argument {name}: the only one is `skip` (a field that holds no layer)"
                )))
            }
        })?;
    }
    Ok(skip)
}

/// `Parameters::visit_params(field, f);`, spanned at the field's type so a type without the
/// trait is reported there.
fn visit_one(f: &Field) -> TokenStream {
    let (access, ty) = (&f.access, &f.ty);
    quote_spanned!(ty.span()=> <#ty as ::tl_nn::Parameters>::visit_params(#access, __f);)
}

/// `f("name", field);`.
fn child_one(f: &Field) -> TokenStream {
    let (access, name) = (&f.access, &f.name);
    quote!(__f(#name, #access);)
}

/// `generics` plus `Ty: Parameters` for each field type that mentions a type parameter.
fn with_bounds(generics: &Generics, types: &[Type]) -> Generics {
    let params: Vec<&Ident> = generics.type_params().map(|p| &p.ident).collect();
    let mut out = generics.clone();
    if params.is_empty() {
        return out;
    }
    let clause = out.make_where_clause();
    let mut seen: Vec<String> = Vec::new();
    for ty in types {
        let key = quote!(#ty).to_string();
        if seen.contains(&key) || !mentions(quote!(#ty), &params) {
            continue;
        }
        seen.push(key);
        clause
            .predicates
            .push(syn::parse_quote_spanned!(Span::call_site()=> #ty: ::tl_nn::Parameters));
    }
    out
}

/// Whether `tokens` contain one of the identifiers `params`.
fn mentions(tokens: TokenStream, params: &[&Ident]) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => params.iter().any(|p| **p == i),
        TokenTree::Group(g) => mentions(g.stream(), params),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(src: &str) -> Result<String, String> {
        let input: DeriveInput = syn::parse_str(src).unwrap();
        expand(&input)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn visits_the_fields_in_order_and_skips_marked_ones() {
        let out = expand_str(
            "struct Block { ln: LayerNorm, #[parameters(skip)] width: usize, up: Linear }",
        )
        .unwrap();
        let (ln, up) = (
            out.find("self . ln").unwrap(),
            out.find("self . up").unwrap(),
        );
        assert!(ln < up, "{out}");
        assert!(!out.contains("width"), "{out}");
        assert!(out.contains("__f (\"ln\" , & self . ln)"), "{out}");
    }

    #[test]
    fn tuple_structs_and_enums_name_their_fields_by_position() {
        let out = expand_str("struct Pair(Linear, #[parameters(skip)] f64, Linear);").unwrap();
        assert!(
            out.contains("self . 0") && out.contains("self . 2"),
            "{out}"
        );
        assert!(!out.contains("self . 1"), "{out}");
        let out = expand_str(
            "enum Model { Mlp(Sequential), Lm { body: Block, #[parameters(skip)] n: usize }, Empty }",
        )
        .unwrap();
        assert!(out.contains("Self :: Mlp (__field0)"), "{out}");
        assert!(out.contains("Self :: Lm { body , n : _ }"), "{out}");
        assert!(out.contains("Self :: Empty"), "{out}");
    }

    #[test]
    fn generic_field_types_get_a_bound_and_others_do_not() {
        let out = expand_str(
            "struct M<O: Train> { seq: Sequential<O>, head: Linear, more: Vec<Sequential<O>> }",
        )
        .unwrap();
        assert!(
            out.contains("Sequential < O > : :: tl_nn :: Parameters"),
            "{out}"
        );
        assert!(
            out.contains("Vec < Sequential < O > > : :: tl_nn :: Parameters"),
            "{out}"
        );
        assert!(!out.contains("Linear : :: tl_nn"), "{out}");
    }

    #[test]
    fn unions_and_unknown_arguments_are_errors_that_say_why() {
        let err = expand_str("union U { a: u32 }").unwrap_err();
        assert!(err.contains("structs and enums, not unions"), "{err}");
        let err = expand_str("struct S { #[parameters(flatten)] a: Linear }").unwrap_err();
        assert!(
            err.contains("unknown #[parameters(...)] argument `flatten`"),
            "{err}"
        );
    }
}
